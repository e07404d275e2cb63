// The official openai npm client (pinned by package-lock.json) against a running mer-gateway's
// HTTP API: chat and completions calls, streaming and not, with the checks a user of vLLM or
// llama-server relies on. Usage: node client.mjs BASE_URL MODEL. Prints one line per check and
// exits 1 if any failed.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "unused", maxRetries: 0, timeout: 120000 });
let failures = 0;
function check(ok, what, detail = "") {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}${detail ? ": " + detail : ""}`);
  if (!ok) failures++;
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

// Models.
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, "models.list", JSON.stringify(models.data));

// Chat, not streamed and streamed: greedy, so both give the same text.
const messages = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Say something." },
];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0 });
const choice = chat.choices[0];
check(chat.object === "chat.completion" && choice.message.role === "assistant", "chat.completions.create",
      JSON.stringify(choice));
check(["stop", "length"].includes(choice.finish_reason), "chat finish_reason", choice.finish_reason);
check(chat.usage.prompt_tokens > 0 && chat.usage.completion_tokens >= 1 && chat.usage.completion_tokens <= 12 &&
      chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, "chat usage",
      JSON.stringify(chat.usage));
const chatChunks = await collect(await client.chat.completions.create(
    { model, messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true } }));
const streamed = chatChunks.flatMap((c) => c.choices.map((x) => x.delta?.content ?? "")).join("");
const streamedReasoning = chatChunks.flatMap((c) => c.choices.map((x) => x.delta?.reasoning_content ?? "")).join("");
check(chatChunks[0].choices[0].delta.role === "assistant", "chat stream starts with the role");
check(streamed === (choice.message.content ?? "") &&
      streamedReasoning === (choice.message.reasoning_content ?? ""), "chat stream text equals the non-streamed text",
      JSON.stringify([streamed, choice.message.content, streamedReasoning, choice.message.reasoning_content]));
const last = chatChunks[chatChunks.length - 1];
check(last.choices.length === 0 && last.usage?.completion_tokens === chat.usage.completion_tokens,
      "chat stream ends with usage (stream_options.include_usage)", JSON.stringify(last));
check(chatChunks.some((c) => c.choices[0]?.finish_reason === choice.finish_reason), "chat stream finish_reason");

// Thinking off (Qwen3's enable_thinking) renders another prompt: more prompt tokens.
const noThink = await client.chat.completions.create(
    { model, messages, max_tokens: 4, temperature: 0, chat_template_kwargs: { enable_thinking: false } });
check(noThink.usage.prompt_tokens > chat.usage.prompt_tokens, "chat_template_kwargs.enable_thinking: false",
      `${noThink.usage.prompt_tokens} vs ${chat.usage.prompt_tokens} prompt tokens`);

// Completions, not streamed and streamed.
const prompt = "Once upon a time";
const comp = await client.completions.create({ model, prompt, max_tokens: 10, temperature: 0, ignore_eos: true });
check(comp.object === "text_completion" && comp.choices[0].finish_reason === "length" &&
      comp.usage.completion_tokens === 10, "completions.create", JSON.stringify(comp.choices[0]));
const compChunks = await collect(await client.completions.create(
    { model, prompt, max_tokens: 10, temperature: 0, ignore_eos: true, stream: true }));
check(compChunks.map((c) => c.choices[0]?.text ?? "").join("") === comp.choices[0].text,
      "completions stream text equals the non-streamed text");

// Token-id prompts, n with a seed, logprobs.
const ids = await client.completions.create({ model, prompt: [1, 2, 3], max_tokens: 3, temperature: 0, ignore_eos: true });
check(ids.usage.prompt_tokens === 3 && ids.usage.completion_tokens === 3, "completions with a token-id prompt");
const many = await client.completions.create(
    { model, prompt, max_tokens: 6, temperature: 1, seed: 7, n: 3, ignore_eos: true });
const again = await client.completions.create(
    { model, prompt, max_tokens: 6, temperature: 1, seed: 7, n: 3, ignore_eos: true });
check(many.choices.length === 3 && many.choices.map((c) => c.index).join() === "0,1,2" &&
      JSON.stringify(many.choices.map((c) => c.text)) === JSON.stringify(again.choices.map((c) => c.text)),
      "n = 3 with a seed is reproducible", JSON.stringify(many.choices.map((c) => c.text)));
check(many.usage.completion_tokens === 18 && many.usage.prompt_tokens === comp.usage.prompt_tokens,
      "n = 3 usage counts the prompt once", JSON.stringify(many.usage));
const lp = await client.chat.completions.create(
    { model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 2, ignore_eos: true });
const content = lp.choices[0].logprobs?.content ?? [];
check(content.length === 5 && content.every((t) => t.logprob <= 0 && t.top_logprobs.length === 2 &&
                                                  t.top_logprobs[0].logprob === t.logprob),
      "chat logprobs (greedy: the token heads its alternatives)", JSON.stringify(content[0]));

// Errors in OpenAI's shape, as the client reports them.
async function expectError(status, what, body) {
  try {
    await client.chat.completions.create(body);
    check(false, what, "no error");
  } catch (e) {
    check(e.status === status && typeof e.error?.message === "string", what, `${e.status} ${e.error?.message}`);
  }
}
await expectError(404, "unknown model: 404", { model: "no-such-model", messages });
await expectError(400, "temperature out of range: 400", { model, messages, temperature: 5 });
await expectError(400, "max_tokens past the context: 400", { model, messages, max_tokens: 100000000 });

console.log(failures === 0 ? "openai client: all checks passed" : `openai client: ${failures} checks failed`);
process.exit(failures === 0 ? 0 : 1);
