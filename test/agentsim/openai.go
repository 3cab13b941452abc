package agentsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// The parts of an OpenAI Responses request the Server reads.
type responsesRequest struct {
	Model string          `json:"model"`
	Input []responsesItem `json:"input"`
	Tools []struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"tools"`
	Stream bool `json:"stream"`
}

type responsesItem struct {
	Type string `json:"type"`
	Role string `json:"role"`
	// Content is an array of {"type":"input_text","text":...} parts (or a
	// string).
	Content json.RawMessage `json:"content"`
	CallID  string          `json:"call_id"`
	// Output is a string, or content parts in newer clients.
	Output json.RawMessage `json:"output"`
}

// openaiConversation finds the latest user prompt and the tool results
// after it. Codex sends its instructions and environment context as user
// messages too, but always before the prompt, so the last user message is
// the prompt.
func openaiConversation(items []responsesItem) (prompt string, results []ToolResult) {
	for _, it := range items {
		switch it.Type {
		case "message":
			if it.Role == "user" {
				prompt = resultText(it.Content)
				results = nil
			}
		case "function_call_output", "custom_tool_call_output":
			results = append(results, ToolResult{ID: it.CallID, Output: resultText(it.Output)})
		}
	}
	return prompt, results
}

// openaiResponses answers POST /v1/responses, which Codex always streams.
// Codex needs only the finished output items (response.output_item.done)
// and a closing response.completed naming the response id; the deltas a
// real server sends before them are optional and left out.
func (s *Server) openaiResponses(w http.ResponseWriter, r *http.Request, body []byte) {
	var req responsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		s.badBody(APIOpenAI, r, body, err)
		writeJSON(w, http.StatusBadRequest, openaiError(err.Error()))
		return
	}
	var tools []string
	for _, t := range req.Tools {
		if t.Name != "" {
			tools = append(tools, t.Name)
		}
	}
	prompt, results := openaiConversation(req.Input)
	step := s.choose(tools, prompt, len(results), "call_")
	rec := newRequest(APIOpenAI, r, body)
	rec.Stream, rec.Tools, rec.Prompt, rec.Results, rec.Reply = req.Stream, tools, prompt, results, step
	s.record(rec)

	n := s.nextSerial()
	respID := fmt.Sprintf("resp_sim%04d", n)
	var items []any
	if step.Text != "" || len(step.Calls) == 0 {
		items = append(items, map[string]any{
			"type": "message", "id": fmt.Sprintf("msg_sim%04d", n), "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": step.Text, "annotations": []any{}}},
		})
	}
	for _, c := range step.Calls {
		items = append(items, openaiCallItem(c))
	}
	usage := map[string]any{
		"input_tokens": tokens(body), "input_tokens_details": map[string]any{"cached_tokens": 0},
		"output_tokens": 1, "output_tokens_details": map[string]any{"reasoning_tokens": 0},
		"total_tokens": tokens(body) + 1,
	}
	if !req.Stream {
		writeJSON(w, http.StatusOK, map[string]any{
			"id": respID, "object": "response", "status": "completed", "model": req.Model,
			"output": items, "usage": usage,
		})
		return
	}
	startSSE(w)
	writeEvent(w, "response.created", map[string]any{
		"type":     "response.created",
		"response": map[string]any{"id": respID, "object": "response", "status": "in_progress", "model": req.Model},
	})
	for i, it := range items {
		writeEvent(w, "response.output_item.done", map[string]any{
			"type": "response.output_item.done", "output_index": i, "item": it,
		})
	}
	writeEvent(w, "response.completed", map[string]any{
		"type": "response.completed",
		"response": map[string]any{
			"id": respID, "object": "response", "status": "completed", "model": req.Model, "usage": usage,
		},
	})
}

// openaiCallItem is the output item for one tool call: a function_call
// with its arguments as a JSON string, or, when the input is a string, a
// custom_tool_call carrying that text (Codex's freeform apply_patch tool).
func openaiCallItem(c ToolCall) map[string]any {
	if text, ok := c.Input.(string); ok {
		return map[string]any{
			"type": "custom_tool_call", "id": "ctc_" + strings.TrimPrefix(c.ID, "call_"),
			"status": "completed", "call_id": c.ID, "name": c.Name, "input": text,
		}
	}
	return map[string]any{
		"type": "function_call", "id": "fc_" + strings.TrimPrefix(c.ID, "call_"),
		"status": "completed", "call_id": c.ID, "name": c.Name, "arguments": string(inputJSON(c.Input)),
	}
}

func openaiError(msg string) map[string]any {
	return map[string]any{"error": map[string]any{"type": "invalid_request_error", "message": msg}}
}
