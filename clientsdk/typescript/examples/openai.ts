// openai-node through polygate: every create is one governed call.
import OpenAI from "openai";
import { Client, governedFetch } from "polygate-sdk";

const PLACEHOLDER = "http://polygate.invalid/v1"; // each attempt goes to the granted source's base_url instead

const pg = new Client(); // POLYGATE_ADDR, POLYGATE_TOKEN
const llm = new OpenAI({
  baseURL: PLACEHOLDER,
  apiKey: process.env.OPENAI_API_KEY ?? "",
  fetch: governedFetch(pg, "chat", { baseUrl: PLACEHOLDER, estimatedTokens: 500, deadlineMs: 120_000 }),
  maxRetries: 0, // one retry layer: the sidecar's
});

try {
  const completion = await llm.chat.completions.create({ model: "gpt-4o-mini", messages: [{ role: "user", content: "Hello" }] });
  console.log(completion.choices[0]?.message.content);
} catch (err) {
  if (err instanceof OpenAI.APIError) {
    // The provider's own error, or polygate's verdict as a 503 (429 for quota):
    console.error(err.status, err.headers?.get("polygate-failure-reason"), err.headers?.get("polygate-retry-after"), err.message);
  }
  throw err;
} finally {
  pg.close();
}
