// Package agentsim lets tests drive the real coding agents — Claude Code,
// Codex CLI and Gemini CLI — offline, by standing in for the model APIs they
// talk to.
//
// stagefs exists to sit under such agents, so its tests want to run the
// agents themselves rather than imitations of them: the real binaries, with
// their real tools, hooks and file-writing habits. What the tests must not
// do is reach a real model: that needs network access and credentials, and
// a model's replies are not repeatable. A Server therefore answers the
// agents' model requests from a Script, a fixed list of replies ("run this
// shell command", "write this file", "say done"), on 127.0.0.1 only.
//
// One Server speaks all three wire protocols on one port, routed by path:
//
//   - Anthropic Messages (Claude Code): POST /v1/messages, streaming or not,
//     and POST /v1/messages/count_tokens.
//   - OpenAI Responses (Codex CLI): POST /v1/responses, streaming.
//   - Gemini (Gemini CLI): POST /v1beta/models/MODEL:streamGenerateContent
//     and :generateContent.
//
// The Server picks a reply by looking at the conversation a request carries:
// the latest user prompt text selects a Script (by substring), and the
// number of tool results that came back since that prompt selects the Step.
// Agents resend the whole conversation on every request, so this needs no
// per-session state, and one Server can serve several prompts and several
// agents in one test. Requests the script does not cover (title generation,
// summaries, other side requests without tools) get a short text reply.
//
// ClaudeEnv, CodexEnv and GeminiEnv return the environment (and write the
// config files) that point each agent at the Server with a throwaway home.
// FindAgent locates the agent binaries that scripts/setup installs, and
// NeedAgent skips a test when one is missing. Run starts an agent with a
// timeout and kills its whole process group.
//
// The facts these stand-ins rest on (event names, required fields, config
// keys) were checked against the agent versions pinned in scripts/setup;
// agentsim_test.go runs each agent once so a version bump that changes them
// fails there first.
package agentsim
