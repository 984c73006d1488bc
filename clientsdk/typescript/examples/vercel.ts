// The Vercel AI SDK through polygate.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText } from "ai";
import { Client, governedFetch } from "polygate-sdk";

const PLACEHOLDER = "http://polygate.invalid/v1";

const pg = new Client({ addr: "127.0.0.1:50051" });
const openai = createOpenAI({
  baseURL: PLACEHOLDER,
  apiKey: process.env.OPENAI_API_KEY ?? "",
  fetch: governedFetch(pg, "chat", { baseUrl: PLACEHOLDER }),
});

const { text } = await generateText({ model: openai.chat("gpt-4o-mini"), prompt: "Hello", maxRetries: 0 });
console.log(text);
pg.close();
