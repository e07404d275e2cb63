#!/usr/bin/env node
// Compares mer against llama.cpp (the correctness reference) on one model and prompt.
//
//   node compare.mjs --mer build/bin/mer --model F.gguf --prompt-tokens 1,2,3 --n 32 --tol 1e-4 --work DIR
//                    [--min-pass-fraction 1.0] [--margin 0.05] [--top 8] [--threads 1]
//
// 1. llama_ref.mjs gives llama.cpp's n greedy tokens L[0..n) and the raw logits that chose each of them.
// 2. `mer generate --model F --prompt-tokens P --max-tokens n --threads 1 --print-token-ids --ignore-eos`
//    must print the same ids (llama_ref does not stop at end-of-generation tokens either). The first
//    divergence is allowed at a step where llama.cpp's own top1-top2 logit margin is < --margin (a near
//    tie); ids are not compared after it. mer may stop early only right after an end-of-generation token.
// 3. `mer score --model F --prompt-tokens P --continuation-tokens L --threads 1 --logits-out FILE`
//    (teacher forcing: row i = mer's logits predicting L[i] after P + L[0..i)). For every step the logits
//    of llama.cpp's top --top tokens are compared: the step passes when max |mer - llama| <= --tol; at
//    least --min-pass-fraction of the steps must pass. mer's argmax must be L[i] at every step where
//    llama.cpp's margin >= --margin.
//
// For reference, each step also shows llama.cpp against itself (the same rows teacher-forced in one batch
// instead of token by token): on quantised models its own numerics move logits by as much as tol at times.
// Prints a per-step report and a one-line verdict (the last line); writes DIR/report.txt and DIR/summary.json.
// Exit: 0 pass, 1 fail (or error), 2 usage, 77 the llama.cpp reference is not installed
// (run scripts/install-llama-ref).
import fs from "node:fs";
import path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { spawnSync } from "node:child_process";
import { parseArgs, parseTokenList, EXIT_NOT_INSTALLED } from "./llama_ref.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));

function usage(msg) {
  if (msg) process.stderr.write(`compare: ${msg}\n`);
  process.stderr.write(
    "usage: node compare.mjs --mer MER --model F.gguf --prompt-tokens 1,2,3 --n 32 --tol F --work DIR\n" +
    "                        [--min-pass-fraction 1.0] [--margin 0.05] [--top 8] [--threads 1]\n");
  process.exit(2);
}

function run(cmd, args, what) {
  const t0 = Date.now();
  const r = spawnSync(cmd, args, { encoding: "utf8", maxBuffer: 256 << 20 });
  const secs = (Date.now() - t0) / 1000;
  if (r.error) throw new Error(`${what}: cannot run ${cmd}: ${r.error.message}`);
  return { status: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr, secs, line: [cmd, ...args].join(" ") };
}

function readF32(file, rows, cols, what) {
  const b = fs.readFileSync(file);
  if (b.length !== rows * cols * 4) {
    throw new Error(`${what}: ${file} has ${b.length} bytes, expected ${rows} x ${cols} x 4 = ${rows * cols * 4}`);
  }
  const a = new Float32Array(rows * cols);
  for (let i = 0; i < rows * cols; i++) a[i] = b.readFloatLE(4 * i);
  return a;
}

// Indices of the k largest values of row (ties: lower id first).
function topK(row, k) {
  const idx = [];
  for (let t = 0; t < row.length; t++) {
    let j = idx.length;
    if (j === k && !(row[t] > row[idx[k - 1]])) continue;
    if (j === k) { idx.pop(); j--; }
    while (j > 0 && row[t] > row[idx[j - 1]]) j--;
    idx.splice(j, 0, t);
  }
  return idx;
}

function argmax(row) {
  let b = 0;
  for (let t = 1; t < row.length; t++) if (row[t] > row[b] || Number.isNaN(row[b])) b = t;
  return b;
}

function fmt(x, w, d = 6) {
  const s = typeof x === "number" ? (Number.isFinite(x) ? x.toExponential(2) : String(x)) : String(x);
  return d === 0 ? String(x).padStart(w) : s.padStart(w);
}

async function main() {
  let a;
  try {
    a = parseArgs(process.argv.slice(2), {
      mer: "string", model: "string", "prompt-tokens": "string", n: "string", tol: "string", work: "string",
      "min-pass-fraction": "string", margin: "string", top: "string", threads: "string",
    });
  } catch (e) {
    usage(e.message);
  }
  for (const k of ["mer", "model", "prompt-tokens", "n", "tol", "work"]) if (a[k] === undefined) usage(`--${k} is required`);
  const prompt = parseTokenList(a["prompt-tokens"]);
  const n = Number(a.n), tol = Number(a.tol);
  const minPass = a["min-pass-fraction"] === undefined ? 1.0 : Number(a["min-pass-fraction"]);
  const marginTol = a.margin === undefined ? 0.05 : Number(a.margin);
  const top = a.top === undefined ? 8 : Number(a.top);
  const threads = a.threads === undefined ? 1 : Number(a.threads);
  if (prompt.length === 0) usage("empty --prompt-tokens");
  if (!Number.isInteger(n) || n < 1) usage("--n must be a positive integer");
  if (!(tol >= 0)) usage("--tol must be a non-negative number");
  if (!(minPass >= 0 && minPass <= 1)) usage("--min-pass-fraction must be in [0, 1]");
  if (!fs.existsSync(a.model)) usage(`no such model ${a.model}`);
  const work = a.work;
  fs.mkdirSync(work, { recursive: true });
  const P = prompt.join(",");
  const log = [];
  const out = (s = "") => { log.push(s); process.stdout.write(s + "\n"); };

  // 1. llama.cpp.
  const refDir = path.join(work, "llama");
  fs.rmSync(refDir, { recursive: true, force: true });
  const ref = run(process.execPath, [path.join(here, "llama_ref.mjs"), "--model", a.model, "--prompt-tokens", P,
    "--n", String(n), "--out", refDir, "--threads", String(threads), "--batch-logits"], "llama_ref");
  if (ref.status === EXIT_NOT_INSTALLED) {
    process.stdout.write("SKIP: the llama.cpp reference is not installed (run scripts/install-llama-ref)\n");
    process.exit(EXIT_NOT_INSTALLED);
  }
  if (ref.status !== 0) {
    process.stderr.write(ref.stderr);
    throw new Error(`llama_ref failed (exit ${ref.status ?? ref.signal}): ${ref.line}`);
  }
  const meta = JSON.parse(fs.readFileSync(path.join(refDir, "meta.json"), "utf8"));
  const V = meta.n_vocab;
  const L = parseTokenList(fs.readFileSync(path.join(refDir, "tokens.txt"), "utf8"));
  if (L.length !== n) throw new Error(`llama_ref wrote ${L.length} tokens, expected ${n}`);
  const refLogits = readF32(path.join(refDir, "logits.f32"), n, V, "llama_ref");
  // llama.cpp against itself: the same rows teacher-forced in one batch (its numerical noise floor).
  const refBatch = readF32(path.join(refDir, "logits_batch.f32"), n, V, "llama_ref");
  const eog = new Set(meta.eog_tokens ?? []);
  // The reference must be the pinned CPU variant on every host (tests/llama/README.md).
  if (meta.cpu_variant == null || meta.cpu_variant !== meta.cpu_variant_pinned) {
    throw new Error(`llama.cpp ran the CPU variant ${meta.cpu_variant}, not the pinned ${meta.cpu_variant_pinned} (run scripts/install-llama-ref)`);
  }

  // Per-step llama.cpp top tokens and top1-top2 margin.
  const refTop = [], margin = [];
  for (let i = 0; i < n; i++) {
    const row = refLogits.subarray(i * V, (i + 1) * V);
    const t = topK(row, Math.max(2, Math.min(top, V)));
    refTop.push(t.slice(0, Math.min(top, V)));
    margin.push(row[t[0]] - row[t[1]]);
    if (t[0] !== L[i] && row[L[i]] !== row[t[0]]) throw new Error(`llama step ${i}: token ${L[i]} is not the argmax ${t[0]}`);
  }

  // 2. mer generate.
  const gen = run(a.mer, ["generate", "--model", a.model, "--prompt-tokens", P, "--max-tokens", String(n),
    "--threads", String(threads), "--print-token-ids", "--ignore-eos"], "mer generate");
  fs.writeFileSync(path.join(work, "mer_generate.stdout"), gen.stdout);
  fs.writeFileSync(path.join(work, "mer_generate.stderr"), gen.stderr);
  const failures = [];
  let genIds = null;
  if (gen.status !== 0) {
    failures.push(`mer generate exited ${gen.status ?? gen.signal}: ${gen.stderr.trim().split("\n").slice(-3).join(" | ")}`);
  } else {
    const lines = gen.stdout.split("\n").map((s) => s.trim()).filter((s) => s !== "");
    try {
      genIds = lines.length === 0 ? [] : parseTokenList(lines[lines.length - 1]);
    } catch (e) {
      failures.push(`mer generate: cannot parse the ids line "${lines[lines.length - 1]}": ${e.message}`);
    }
    if (genIds && genIds.length === prompt.length + n && prompt.every((t, i) => genIds[i] === t)) {
      out("note: mer generate printed the prompt too; comparing only the generated ids");
      genIds = genIds.slice(prompt.length);
    }
  }
  // Greedy ids: equal, except that the first divergence may be at a near tie of llama.cpp's.
  const genStatus = new Array(n).fill("");
  let divergedAt = -1, stoppedAt = -1;
  if (genIds) {
    for (let i = 0; i < n; i++) {
      if (i >= genIds.length) {
        if (i > 0 && eog.has(L[i - 1])) { stoppedAt = i; genStatus[i] = "stop"; break; }
        failures.push(`mer generate printed ${genIds.length} ids, llama.cpp generated ${n} (step ${i}: llama ${L[i]})`);
        genStatus[i] = "SHORT";
        break;
      }
      if (genIds[i] === L[i]) { genStatus[i] = "ok"; continue; }
      if (margin[i] < marginTol) {
        divergedAt = i;
        genStatus[i] = "tie-div";
      } else {
        genStatus[i] = "DIVERGE";
        failures.push(`mer generate diverges at step ${i}: mer ${genIds[i]}, llama ${L[i]} (llama margin ${margin[i].toFixed(4)} >= ${marginTol})`);
      }
      break;
    }
    if (divergedAt < 0 && stoppedAt < 0 && genIds.length > n) failures.push(`mer generate printed ${genIds.length} ids, more than --max-tokens ${n}`);
  }

  // 3. mer score (teacher forcing on llama.cpp's tokens).
  const scoreFile = path.join(work, "mer_logits.f32");
  fs.rmSync(scoreFile, { force: true });
  const sc = run(a.mer, ["score", "--model", a.model, "--prompt-tokens", P, "--continuation-tokens", L.join(","),
    "--threads", String(threads), "--logits-out", scoreFile], "mer score");
  fs.writeFileSync(path.join(work, "mer_score.stdout"), sc.stdout);
  fs.writeFileSync(path.join(work, "mer_score.stderr"), sc.stderr);
  let merLogits = null;
  if (sc.status !== 0) {
    failures.push(`mer score exited ${sc.status ?? sc.signal}: ${sc.stderr.trim().split("\n").slice(-3).join(" | ")}`);
  } else {
    try {
      merLogits = readF32(scoreFile, n, V, "mer score");
    } catch (e) {
      failures.push(e.message);
    }
  }
  const steps = [];
  let passSteps = 0, worst = 0, worstStep = -1, selfPass = 0, selfWorst = 0;
  for (let i = 0; i < n; i++) {
    const s = { step: i, llama: L[i], mer_gen: genIds && i < genIds.length ? genIds[i] : null, margin: margin[i], gen: genStatus[i] };
    {
      const ref = refLogits.subarray(i * V, (i + 1) * V), rb = refBatch.subarray(i * V, (i + 1) * V);
      let d = 0;
      for (const t of refTop[i]) d = Math.max(d, Math.abs(rb[t] - ref[t]));
      s.llama_self_diff = d;
      if (d <= tol) selfPass++;
      selfWorst = Math.max(selfWorst, d);
    }
    if (merLogits) {
      const ref = refLogits.subarray(i * V, (i + 1) * V), mer = merLogits.subarray(i * V, (i + 1) * V);
      let d = 0, dTok = -1;
      for (const t of refTop[i]) {
        const e = Math.abs(mer[t] - ref[t]);
        if (!(e <= d)) { d = e; dTok = t; }          // NaN counts as the worst
      }
      s.max_abs_diff = Number.isNaN(d) ? Infinity : d;
      s.worst_token = dTok;
      s.mer_argmax = argmax(mer);
      s.within_tol = s.max_abs_diff <= tol;
      if (s.within_tol) passSteps++;
      if (!(s.max_abs_diff <= worst)) { worst = s.max_abs_diff; worstStep = i; }
      if (s.mer_argmax !== L[i] && margin[i] >= marginTol && mer[s.mer_argmax] !== mer[L[i]]) {
        s.argmax_fail = true;
        failures.push(`mer score argmax at step ${i} is ${s.mer_argmax} (logit ${mer[s.mer_argmax]}), llama ${L[i]} (mer ${mer[L[i]]}, llama ${ref[L[i]]}, llama margin ${margin[i].toFixed(4)})`);
      }
    }
    steps.push(s);
  }
  const passFrac = merLogits ? passSteps / n : 0;
  if (merLogits && passFrac < minPass) {
    failures.push(`${passSteps}/${n} steps within tol ${tol} (fraction ${passFrac.toFixed(3)} < required ${minPass}); worst ${worst.toExponential(3)} at step ${worstStep}`);
  }

  // Report.
  out(`model ${a.model}  n_vocab ${V}  prompt [${P}] (${prompt.length} tokens)  n ${n}  tol ${tol}  top ${top}  margin ${marginTol}  min-pass ${minPass}`);
  out(`llama.cpp: node-llama-cpp ${meta.node_llama_cpp}, release ${meta.llama_cpp_release}, CPU variant ${meta.cpu_variant}, threads ${meta.threads_used}, flash attention ${meta.flash_attention}, KV ${meta.kv_cache_key_type}/${meta.kv_cache_value_type} (${ref.secs.toFixed(1)} s)`);
  out(`mer generate ${gen.secs.toFixed(1)} s, mer score ${sc.secs.toFixed(1)} s`);
  out("max|diff| is over llama.cpp's top tokens of the step; llama_self is llama.cpp batch vs single-token (its own noise)");
  out("step  llama    mer  gen       margin  mer_argmax  max|diff|  worst_tok  llama_self  ok");
  for (const s of steps) {
    out(`${String(s.step).padStart(4)}  ${String(s.llama).padStart(5)}  ${String(s.mer_gen ?? "-").padStart(5)}  ${(s.gen || "-").padEnd(7)}  ${s.margin.toFixed(4).padStart(9)}` +
      `  ${String(s.mer_argmax ?? "-").padStart(10)}  ${s.max_abs_diff === undefined ? "        -" : fmt(s.max_abs_diff, 9)}  ${String(s.worst_token ?? "-").padStart(9)}  ${fmt(s.llama_self_diff, 10)}` +
      `  ${s.max_abs_diff === undefined ? "-" : (s.within_tol ? "yes" : "NO")}${s.argmax_fail ? " ARGMAX" : ""}`);
  }
  for (const f of failures) out(`failure: ${f}`);
  const genSummary = genIds == null ? "generate: n/a"
    : divergedAt >= 0 ? `generate: ids equal up to step ${divergedAt}, then a near-tie divergence (margin ${margin[divergedAt].toFixed(4)})`
    : stoppedAt >= 0 ? `generate: ids equal, mer stopped at end-of-generation after ${stoppedAt}`
    : genStatus.every((x) => x === "ok") ? `generate: ${n}/${n} ids equal` : "generate: MISMATCH";
  const verdict = failures.length === 0 ? "PASS" : "FAIL";
  const line = `${verdict}: ${path.basename(a.model)}: ${genSummary}; score: ${passSteps}/${n} steps within ${tol} (worst ${worst.toExponential(3)} at step ${worstStep})` +
    (failures.length ? `; ${failures.length} failure(s)` : "");
  out(`(llama.cpp against itself, batch vs single-token: ${selfPass}/${n} steps within ${tol}, worst ${selfWorst.toExponential(3)})`);
  out(line);
  fs.writeFileSync(path.join(work, "report.txt"), log.join("\n") + "\n");
  fs.writeFileSync(path.join(work, "summary.json"), JSON.stringify({
    verdict, model: a.model, prompt, n, tol, min_pass_fraction: minPass, margin: marginTol, top, llama_tokens: L,
    mer_generate_ids: genIds, diverged_at: divergedAt, stopped_at: stoppedAt, pass_steps: passSteps, worst_abs_diff: worst,
    worst_step: worstStep, llama_self_pass_steps: selfPass, llama_self_worst: selfWorst, failures, steps,
  }, null, 2) + "\n");
  process.exit(failures.length === 0 ? 0 : 1);
}

main().catch((e) => {
  process.stderr.write(`compare: ${e?.stack ?? e}\n`);
  process.stdout.write(`FAIL: ${e?.message ?? e}\n`);
  process.exit(1);
});
