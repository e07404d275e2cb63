#!/usr/bin/env node
// llama.cpp's side of `mer bench`: the same method on the same GGUF file, through the pinned
// node-llama-cpp (tests/llama; install with scripts/install-llama-ref).
//
//   node llama_bench.mjs --model F.gguf --prompt-tokens 1,2,3 [--gen-tokens 128] [--runs 3]
//                        [--warmup 1] [--threads N]
//
// Greedy decoding (temperature 0, no penalties), F16 KV cache and flash attention off (llama.cpp's
// CPU defaults for this node-llama-cpp version are used except where named). Each run clears the
// sequence, evaluates the prompt and generates --gen-tokens tokens. Prints prompt tokens/s, decode
// tokens/s (tokens after the first over the time after the first), TTFT p50 and mean total time,
// medians over the measured runs, in the format of `mer bench`.
import process from "node:process";
import { importNodeLlamaCpp, loadedCpuVariant, openLlama, parseArgs, parseTokenList } from "../llama/llama_ref.mjs";

const args = parseArgs(process.argv.slice(2), {
  model: "string", "prompt-tokens": "string", "gen-tokens": "string", runs: "string",
  warmup: "string", threads: "string",
});
const prompt = parseTokenList(args["prompt-tokens"] ?? "");
const nGen = Number(args["gen-tokens"] ?? 128);
const runs = Number(args.runs ?? 3);
const warmup = Number(args.warmup ?? 1);
const threads = Number(args.threads ?? 2);
if (!args.model || prompt.length === 0) {
  process.stderr.write("usage: node llama_bench.mjs --model F.gguf --prompt-tokens 1,2,3 [...]\n");
  process.exit(2);
}
const nlc = await importNodeLlamaCpp();
if (nlc == null) {
  process.stderr.write("llama_bench: node-llama-cpp is not installed (scripts/install-llama-ref)\n");
  process.exit(77);
}
const llama = await openLlama(nlc, threads);
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0, defaultContextFlashAttention: false });
const ctxSize = prompt.length + nGen + 16;
const context = await model.createContext({
  contextSize: ctxSize, batchSize: Math.max(512, prompt.length), sequences: 1, flashAttention: false,
  threads: { ideal: threads, min: threads },
});
const seq = context.getSequence();

const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];
const promptTps = [], decodeTps = [], ttft = [], total = [];
for (let r = 0; r < warmup + runs; r++) {
  await seq.clearHistory();
  const t0 = performance.now();
  let tFirst = 0, n = 0;
  for await (const _token of seq.evaluate(prompt, { temperature: 0 })) {
    if (n === 0) tFirst = performance.now();
    if (++n === nGen) break;
  }
  const tEnd = performance.now();
  if (r < warmup) continue;
  promptTps.push(prompt.length / ((tFirst - t0) / 1e3));
  decodeTps.push((nGen - 1) / ((tEnd - tFirst) / 1e3));
  ttft.push(tFirst - t0);
  total.push((tEnd - t0) / 1e3);
}
process.stdout.write(`engine           llama.cpp ${llama.llamaCppRelease?.release ?? "?"} (node-llama-cpp, CPU, ${context.currentThreads} threads)\n`);
process.stdout.write(`cpu_variant      ${loadedCpuVariant()}\n`);
process.stdout.write(`method           greedy, ${prompt.length} prompt + ${nGen} generated tokens, ${warmup} warm-up + ${runs} runs\n`);
process.stdout.write(`prompt_tps       ${median(promptTps).toFixed(1)}\n`);
process.stdout.write(`decode_tps       ${median(decodeTps).toFixed(1)}\n`);
process.stdout.write(`ttft_p50_ms      ${median(ttft).toFixed(2)}\n`);
process.stdout.write(`total_mean_s     ${(total.reduce((a, b) => a + b, 0) / total.length).toFixed(3)}\n`);
process.stdout.write(`peak_rss_mib     ${(process.resourceUsage().maxRSS / 1024).toFixed(1)}\n`);
await context.dispose();
await model.dispose();
await llama.dispose();
