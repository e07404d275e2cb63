#!/usr/bin/env node
// Tokenizer parity with llama.cpp:
//   node tokenizer_compare.mjs --mer MER --model F.gguf --text-file T.txt [--work DIR]
// llama_ref.mjs --tokenize-file (llama.cpp, no BOS, special tokens parsed) and
// `mer tokenize --model F --text-file T` (ids on one line) must print the same ids. With --work DIR, a
// variant of T with CRLF line endings and lone CRs (kept out of the committed file, where editors and git
// could rewrite them) is checked too.
// Exit: 0 equal, 1 different (or error), 2 usage, 77 the llama.cpp reference is not installed.
import fs from "node:fs";
import path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { spawnSync } from "node:child_process";
import { parseArgs, parseTokenList, EXIT_NOT_INSTALLED } from "./llama_ref.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));

function idsOf(r, what) {
  if (r.error) throw new Error(`${what}: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`${what} exited ${r.status ?? r.signal}: ${r.stderr.trim().split("\n").slice(-3).join(" | ")}`);
  const lines = r.stdout.split("\n").map((s) => s.trim()).filter((s) => s !== "");
  return lines.length === 0 ? [] : parseTokenList(lines[lines.length - 1]);
}

function compareOne(a, textFile, label) {
  const ref = spawnSync(process.execPath, [path.join(here, "llama_ref.mjs"), "--model", a.model, "--tokenize-file", textFile],
    { encoding: "utf8", maxBuffer: 64 << 20 });
  if (ref.status === EXIT_NOT_INSTALLED) {
    process.stdout.write("SKIP: the llama.cpp reference is not installed (run scripts/install-llama-ref)\n");
    process.exit(EXIT_NOT_INSTALLED);
  }
  const want = idsOf(ref, "llama_ref --tokenize-file");
  const got = idsOf(spawnSync(a.mer, ["tokenize", "--model", a.model, "--text-file", textFile],
    { encoding: "utf8", maxBuffer: 64 << 20 }), "mer tokenize");
  if (a.work) {
    fs.writeFileSync(path.join(a.work, `${label}.llama_ids.txt`), want.join(" ") + "\n");
    fs.writeFileSync(path.join(a.work, `${label}.mer_ids.txt`), got.join(" ") + "\n");
  }
  const bytes = fs.statSync(textFile).size;
  let i = 0;
  while (i < want.length && i < got.length && want[i] === got[i]) i++;
  if (i === want.length && i === got.length) {
    process.stdout.write(`${label}: ${want.length} ids equal (${bytes} bytes of text)\n`);
    return null;
  }
  const ctx = (v) => `[${v.slice(Math.max(0, i - 5), i).join(" ")} | ${v.slice(i, i + 8).join(" ")}]`;
  process.stdout.write(`${label}: llama.cpp ${want.length} ids, mer ${got.length} ids; first difference at index ${i}\n`);
  process.stdout.write(`  llama ${ctx(want)}\n  mer   ${ctx(got)}\n`);
  return `${label}: ids differ from index ${i} (llama ${want[i] ?? "end"}, mer ${got[i] ?? "end"})`;
}

function main() {
  let a;
  try {
    a = parseArgs(process.argv.slice(2), { mer: "string", model: "string", "text-file": "string", work: "string" });
  } catch (e) {
    process.stderr.write(`tokenizer_compare: ${e.message}\n`);
    process.exit(2);
  }
  for (const k of ["mer", "model", "text-file"]) {
    if (a[k] === undefined) { process.stderr.write(`tokenizer_compare: --${k} is required\n`); process.exit(2); }
  }
  const cases = [[a["text-file"], "text"]];
  if (a.work) {
    fs.mkdirSync(a.work, { recursive: true });
    const text = fs.readFileSync(a["text-file"], "utf8");
    const lines = text.split("\n");
    // CRLF on every other line, a lone CR inside every fifth line, CR runs at the end.
    const crlf = lines.map((l, k) => (k % 5 === 2 ? l.replace(" ", " \r") : l) + (k + 1 < lines.length ? (k % 2 ? "\r\n" : "\n") : "")).join("") +
      "\r\n\r\n\r\r\n  \r\n\t\r";
    const f = path.join(a.work, "text_crlf.txt");
    fs.writeFileSync(f, crlf);
    cases.push([f, "text_crlf"]);
  }
  const failures = cases.map(([f, label]) => compareOne(a, f, label)).filter((x) => x != null);
  if (failures.length === 0) {
    process.stdout.write(`PASS: tokenizer: ${cases.map((c) => c[1]).join(", ")} equal to llama.cpp\n`);
    process.exit(0);
  }
  process.stdout.write(`FAIL: tokenizer: ${failures.join("; ")}\n`);
  process.exit(1);
}

try {
  main();
} catch (e) {
  process.stdout.write(`FAIL: ${e.message}\n`);
  process.exit(1);
}
