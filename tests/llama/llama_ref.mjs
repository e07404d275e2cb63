#!/usr/bin/env node
// llama.cpp reference runner for mer's correctness tests (node-llama-cpp 3.22.1, prebuilt CPU binaries).
//
//   node llama_ref.mjs --model F.gguf --prompt-tokens 1,2,3 --n 32 --out DIR
//       Greedy decoding of n tokens after the prompt. Writes to DIR:
//         tokens.txt   the n greedy token ids, space-separated, one line
//         logits.f32   n rows x n_vocab little-endian float32; row i = llama.cpp's raw logits after
//                      prompt + tokens[0..i), i.e. the distribution that chose tokens[i]
//         meta.json    n_vocab, end-of-generation token ids, the settings used, llama.cpp build info
//         logits_batch.f32  (with --batch-logits) the same rows, teacher-forced: prompt + tokens[0..n-1)
//                      evaluated again from an empty cache in one batch. It differs from logits.f32 only
//                      by llama.cpp's own batch-vs-single-token numerics (a noise floor for comparisons).
//   node llama_ref.mjs --model F.gguf --tokenize-file T.txt
//       Prints llama.cpp's token ids of T.txt's contents on one line (no BOS added, special tokens parsed).
//
// Settings: CPU only (gpu: false), 1 thread (--threads to change), flash attention off, K and V cache F32,
// greedy sampling (temperature 0: node-llama-cpp's sampler chain is then only llama.cpp's greedy sampler,
// which selects and does not modify logits; no repeat/DRY penalties, no token bias, no top-k/top-p/min-p).
// The prebuilt binaries are used as installed; it never downloads or builds llama.cpp (build: "never",
// skipDownload: true). Exit codes: 0 ok, 1 error, 2 usage, 77 the reference is not installed
// (run scripts/install-llama-ref).
import fs from "node:fs";
import path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";

export const EXIT_NOT_INSTALLED = 77;

function usage(msg) {
  if (msg) process.stderr.write(`llama_ref: ${msg}\n`);
  process.stderr.write(
    "usage: node llama_ref.mjs --model F.gguf --prompt-tokens 1,2,3 --n 32 --out DIR [--threads 1] [--batch-logits] [--verbose]\n" +
    "       node llama_ref.mjs --model F.gguf --tokenize-file T.txt\n");
  process.exit(2);
}

export function parseArgs(argv, spec) {
  // spec: {name: "string" | "bool"}; returns {name: value}.
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith("--")) throw new Error(`unexpected argument ${a}`);
    let name = a.slice(2), value;
    const eq = name.indexOf("=");
    if (eq >= 0) { value = name.slice(eq + 1); name = name.slice(0, eq); }
    if (!(name in spec)) throw new Error(`unknown option --${name}`);
    if (spec[name] === "bool") { out[name] = value === undefined ? true : value !== "false"; continue; }
    if (value === undefined) {
      if (i + 1 >= argv.length) throw new Error(`--${name} needs a value`);
      value = argv[++i];
    }
    out[name] = value;
  }
  return out;
}

export function parseTokenList(s) {
  const t = s.trim();
  if (t === "") return [];
  return t.split(/[\s,]+/).map((x) => {
    if (!/^\d+$/.test(x)) throw new Error(`bad token id "${x}"`);
    return Number(x);
  });
}

// The installed node-llama-cpp, or null where tests/llama/node_modules lacks it.
export async function importNodeLlamaCpp() {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const pkg = path.join(here, "node_modules", "node-llama-cpp", "package.json");
  const bin = path.join(here, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64", "llama-addon.node");
  if (!fs.existsSync(pkg) || !fs.existsSync(bin)) return null;
  const version = JSON.parse(fs.readFileSync(pkg, "utf8")).version;
  if (version !== "3.22.1") throw new Error(`node-llama-cpp ${version} installed, 3.22.1 expected (run scripts/install-llama-ref)`);
  // Never download or build llama.cpp, whatever the environment says.
  process.env.NODE_LLAMA_CPP_SKIP_DOWNLOAD = "true";
  const mod = await import("node-llama-cpp");
  return mod;
}

let verbose = false;

// The libggml-cpu-*.so variant ggml loaded into this process (from /proc/self/maps), e.g.
// "haswell"; null when none is mapped yet. scripts/install-llama-ref pins which one is installed.
export function loadedCpuVariant() {
  const maps = fs.readFileSync("/proc/self/maps", "utf8");
  const m = maps.match(/libggml-cpu-([A-Za-z0-9_]+)\.so/);
  return m ? m[1] : null;
}

// The variant scripts/install-llama-ref pinned (tests/llama/node_modules/.mer-llama-cpu-variant).
export function pinnedCpuVariant() {
  const here = path.dirname(fileURLToPath(import.meta.url));
  const f = path.join(here, "node_modules", ".mer-llama-cpu-variant");
  return fs.existsSync(f) ? fs.readFileSync(f, "utf8").trim() : null;
}

export async function openLlama(nlc, threads) {
  return nlc.getLlama({
    gpu: false,
    build: "never",
    skipDownload: true,
    usePrebuiltBinaries: true,
    progressLogs: false,
    maxThreads: threads,
    logLevel: verbose ? nlc.LlamaLogLevel.info : nlc.LlamaLogLevel.warn,
    logger: (level, message) => {
      const m = String(message).trimEnd();
      if (m !== "") process.stderr.write(`llama.cpp[${level}]: ${m}\n`);
    },
  });
}

export async function tokenizeText(nlc, modelPath, text) {
  const llama = await openLlama(nlc, 1);
  const model = await llama.loadModel({ modelPath, gpuLayers: 0, vocabOnly: true });
  // LlamaModel.tokenize(text, true) = common_tokenize(vocab, text, add_special=false, parse_special=true).
  const ids = Array.from(model.tokenize(text, true));
  await model.dispose();
  await llama.dispose();
  return ids;
}

// Greedy-decodes n tokens after prompt; returns {tokens, logits: Float32Array(n * nVocab), nVocab, meta}.
export async function greedyWithLogits(nlc, modelPath, prompt, n, threads = 1, batchLogits = false) {
  if (prompt.length === 0) throw new Error("empty prompt");
  const llama = await openLlama(nlc, threads);
  const model = await llama.loadModel({
    modelPath,
    gpuLayers: 0,
    defaultContextFlashAttention: false,
    experimentalDefaultContextKvCacheKeyType: "F32",
    experimentalDefaultContextKvCacheValueType: "F32",
  });
  const nVocab = model.fileInsights?.tokens?.vocabularySize ?? countTokens(model);
  for (const t of prompt) {
    if (t >= nVocab) throw new Error(`prompt token ${t} >= n_vocab ${nVocab}`);
  }
  const ctxSize = prompt.length + n + 16;
  const context = await model.createContext({
    contextSize: ctxSize,
    batchSize: ctxSize,
    sequences: 1,
    flashAttention: false,
    threads: { ideal: threads, min: threads },
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
  });
  const seq = context.getSequence();
  const want = { generateNext: { token: true, logits: true } };
  const tokens = [];
  const logits = new Float32Array(n * nVocab);
  let maxAbsLse = 0;
  for (let i = 0; i < n; i++) {
    const input = i === 0
      ? [...prompt.slice(0, -1), [prompt[prompt.length - 1], want]]
      : [[tokens[i - 1], want]];
    const res = await seq.controlledEvaluate(input);
    const next = res[input.length - 1]?.next;
    if (next?.logits == null) throw new Error(`step ${i}: llama.cpp returned no logits`);
    if (next.logits.size !== nVocab) throw new Error(`step ${i}: ${next.logits.size} logits, n_vocab ${nVocab}`);
    const row = logits.subarray(i * nVocab, (i + 1) * nVocab);
    row.fill(Number.NaN);
    for (const [tok, v] of next.logits) row[tok] = v;
    let best = 0, lseMax = -Infinity;
    for (let t = 0; t < nVocab; t++) {
      if (!Number.isFinite(row[t])) throw new Error(`step ${i}: logit of token ${t} is ${row[t]}`);
      if (row[t] > row[best]) best = t;
      if (row[t] > lseMax) lseMax = row[t];
    }
    let se = 0;
    for (let t = 0; t < nVocab; t++) se += Math.exp(row[t] - lseMax);
    maxAbsLse = Math.max(maxAbsLse, Math.abs(lseMax + Math.log(se)));
    const tok = next.token;
    if (tok == null) throw new Error(`step ${i}: llama.cpp's greedy sampler chose no token`);
    if (tok !== best && row[tok] !== row[best]) {
      throw new Error(`step ${i}: greedy sampler chose ${tok} (logit ${row[tok]}) but the argmax is ${best} (${row[best]}); logits are not raw`);
    }
    tokens.push(tok);
  }
  let logitsBatch = null;
  if (batchLogits) {
    await seq.clearHistory();
    const all = [...prompt, ...tokens.slice(0, n - 1)];
    const input = all.map((t, k) => (k >= prompt.length - 1 ? [t, { generateNext: { logits: true } }] : t));
    const res = await seq.controlledEvaluate(input);
    logitsBatch = new Float32Array(n * nVocab);
    for (let i = 0; i < n; i++) {
      const lg = res[prompt.length - 1 + i]?.next?.logits;
      if (lg == null || lg.size !== nVocab) throw new Error(`batch row ${i}: no logits`);
      const row = logitsBatch.subarray(i * nVocab, (i + 1) * nVocab);
      for (const [tok, v] of lg) row[tok] = v;
    }
  }
  const eog = [];
  for (const t of model.iterateAllTokens()) if (model.isEogToken(t)) eog.push(t);
  const here = path.dirname(fileURLToPath(import.meta.url));
  const meta = {
    n_vocab: nVocab,
    n_prompt: prompt.length,
    n,
    eog_tokens: eog,
    threads_requested: threads,
    threads_used: context.currentThreads,
    flash_attention: context.flashAttention,
    kv_cache_key_type: "F32",
    kv_cache_value_type: "F32",
    context_size: context.contextSize,
    sampler: "greedy (temperature 0)",
    // Raw logits are unnormalised; log-softmax output would have logsumexp 0 in every row.
    max_abs_logsumexp: maxAbsLse,
    node_llama_cpp: JSON.parse(fs.readFileSync(path.join(here, "node_modules", "node-llama-cpp", "package.json"), "utf8")).version,
    llama_cpp_release: llama.llamaCppRelease?.release,
    build_type: llama.buildType,
    gpu: llama.gpu,
    // The ggml CPU kernels that ran (scripts/install-llama-ref pins one for every host).
    cpu_variant: loadedCpuVariant(),
    cpu_variant_pinned: pinnedCpuVariant(),
  };
  await context.dispose();
  await model.dispose();
  await llama.dispose();
  return { tokens, logits, logitsBatch, nVocab, meta };
}

function countTokens(model) {
  let n = 0;
  for (const _ of model.iterateAllTokens()) n++;
  return n;
}

async function main() {
  let args;
  try {
    args = parseArgs(process.argv.slice(2), {
      model: "string", "prompt-tokens": "string", n: "string", out: "string", "tokenize-file": "string", threads: "string", verbose: "bool", "batch-logits": "bool",
    });
  } catch (e) {
    usage(e.message);
  }
  verbose = !!args.verbose;
  if (!args.model) usage("--model is required");
  if (!fs.existsSync(args.model)) usage(`no such model file ${args.model}`);
  const nlc = await importNodeLlamaCpp();
  if (nlc == null) {
    process.stderr.write("llama_ref: node-llama-cpp is not installed in tests/llama/node_modules (run scripts/install-llama-ref)\n");
    process.exit(EXIT_NOT_INSTALLED);
  }
  if (args["tokenize-file"] !== undefined) {
    const text = fs.readFileSync(args["tokenize-file"], "utf8");
    const ids = await tokenizeText(nlc, args.model, text);
    process.stdout.write(ids.join(" ") + "\n");
    return;
  }
  if (args["prompt-tokens"] === undefined || args.n === undefined || args.out === undefined) {
    usage("--prompt-tokens, --n and --out are required (or --tokenize-file)");
  }
  const prompt = parseTokenList(args["prompt-tokens"]);
  const n = Number(args.n);
  const threads = args.threads === undefined ? 1 : Number(args.threads);
  if (!Number.isInteger(n) || n < 1) usage("--n must be a positive integer");
  if (!Number.isInteger(threads) || threads < 1) usage("--threads must be a positive integer");
  const r = await greedyWithLogits(nlc, args.model, prompt, n, threads, !!args["batch-logits"]);
  fs.mkdirSync(args.out, { recursive: true });
  fs.writeFileSync(path.join(args.out, "tokens.txt"), r.tokens.join(" ") + "\n");
  fs.writeFileSync(path.join(args.out, "logits.f32"), Buffer.from(r.logits.buffer, r.logits.byteOffset, r.logits.byteLength));
  if (r.logitsBatch) {
    fs.writeFileSync(path.join(args.out, "logits_batch.f32"), Buffer.from(r.logitsBatch.buffer, r.logitsBatch.byteOffset, r.logitsBatch.byteLength));
  }
  fs.writeFileSync(path.join(args.out, "meta.json"), JSON.stringify(r.meta, null, 2) + "\n");
  process.stderr.write(`llama_ref: ${n} tokens, n_vocab ${r.nVocab}, threads ${r.meta.threads_used}, written to ${args.out}\n`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(fileURLToPath(import.meta.url))) {
  main().catch((e) => {
    process.stderr.write(`llama_ref: ${e?.stack ?? e}\n`);
    process.exit(1);
  });
}
