package agentsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// The parts of an Anthropic Messages request the Server reads.
type anthropicRequest struct {
	Model    string             `json:"model"`
	Messages []anthropicMessage `json:"messages"`
	Tools    []struct {
		Name string `json:"name"`
	} `json:"tools"`
	Stream bool `json:"stream"`
}

type anthropicMessage struct {
	Role string `json:"role"`
	// Content is a string or an array of blocks.
	Content json.RawMessage `json:"content"`
}

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// blocks returns a message's content as blocks, a plain string content
// being one text block.
func (m anthropicMessage) blocks() []anthropicBlock {
	var str string
	if json.Unmarshal(m.Content, &str) == nil {
		return []anthropicBlock{{Type: "text", Text: str}}
	}
	var bs []anthropicBlock
	json.Unmarshal(m.Content, &bs)
	return bs
}

// anthropicConversation finds the latest user prompt and the tool results
// after it. A prompt is a user message with text and no tool_result: Claude
// Code puts reminders as text blocks into its first user message (beside
// the prompt) and may put text beside tool results too, so "has text" alone
// would mistake a tool-result message for a new prompt.
func anthropicConversation(msgs []anthropicMessage) (prompt string, results []ToolResult) {
	for _, m := range msgs {
		if m.Role != "user" {
			continue
		}
		var texts []string
		var rs []ToolResult
		for _, b := range m.blocks() {
			switch b.Type {
			case "text":
				texts = append(texts, b.Text)
			case "tool_result":
				rs = append(rs, ToolResult{ID: b.ToolUseID, Output: resultText(b.Content), IsError: b.IsError})
			}
		}
		if len(texts) > 0 && len(rs) == 0 {
			prompt = strings.Join(texts, "\n")
			results = nil
			continue
		}
		results = append(results, rs...)
	}
	return prompt, results
}

// anthropicMessages answers POST /v1/messages (Claude Code adds ?beta=true):
// a stream of server-sent events when the request asks for one, as Claude
// Code always does, else one JSON message.
func (s *Server) anthropicMessages(w http.ResponseWriter, r *http.Request, body []byte) {
	var req anthropicRequest
	if err := json.Unmarshal(body, &req); err != nil {
		s.badBody(APIAnthropic, r, body, err)
		writeJSON(w, http.StatusBadRequest, anthropicError("invalid_request_error", err.Error()))
		return
	}
	var tools []string
	for _, t := range req.Tools {
		tools = append(tools, t.Name)
	}
	prompt, results := anthropicConversation(req.Messages)
	step := s.choose(tools, prompt, len(results), "toolu_")
	rec := newRequest(APIAnthropic, r, body)
	rec.Stream, rec.Tools, rec.Prompt, rec.Results, rec.Reply = req.Stream, tools, prompt, results, step
	s.record(rec)

	id := fmt.Sprintf("msg_sim%04d", s.nextSerial())
	stop := "end_turn"
	if len(step.Calls) > 0 {
		stop = "tool_use"
	}
	usage := map[string]any{"input_tokens": tokens(body), "output_tokens": 1}
	if !req.Stream {
		var content []any
		if step.Text != "" || len(step.Calls) == 0 {
			content = append(content, map[string]any{"type": "text", "text": step.Text})
		}
		for _, c := range step.Calls {
			content = append(content, map[string]any{
				"type": "tool_use", "id": c.ID, "name": c.Name, "input": json.RawMessage(inputJSON(c.Input)),
			})
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": req.Model,
			"content": content, "stop_reason": stop, "stop_sequence": nil, "usage": usage,
		})
		return
	}

	startSSE(w)
	writeEvent(w, "message_start", map[string]any{
		"type": "message_start",
		"message": map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": req.Model,
			"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": usage,
		},
	})
	index := 0
	if step.Text != "" || len(step.Calls) == 0 {
		writeEvent(w, "content_block_start", map[string]any{
			"type": "content_block_start", "index": index,
			"content_block": map[string]any{"type": "text", "text": ""},
		})
		writeEvent(w, "content_block_delta", map[string]any{
			"type": "content_block_delta", "index": index,
			"delta": map[string]any{"type": "text_delta", "text": step.Text},
		})
		writeEvent(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	for _, c := range step.Calls {
		// The input goes as a JSON string in one input_json_delta, after a
		// block start with an empty input, as the real API streams it.
		writeEvent(w, "content_block_start", map[string]any{
			"type": "content_block_start", "index": index,
			"content_block": map[string]any{"type": "tool_use", "id": c.ID, "name": c.Name, "input": map[string]any{}},
		})
		writeEvent(w, "content_block_delta", map[string]any{
			"type": "content_block_delta", "index": index,
			"delta": map[string]any{"type": "input_json_delta", "partial_json": string(inputJSON(c.Input))},
		})
		writeEvent(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": index})
		index++
	}
	writeEvent(w, "message_delta", map[string]any{
		"type":  "message_delta",
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": 1 + index},
	})
	writeEvent(w, "message_stop", map[string]any{"type": "message_stop"})
}

// anthropicCountTokens answers POST /v1/messages/count_tokens with a rough
// count.
func (s *Server) anthropicCountTokens(w http.ResponseWriter, r *http.Request, body []byte) {
	s.record(newRequest(APIAnthropic, r, body))
	writeJSON(w, http.StatusOK, map[string]any{"input_tokens": tokens(body)})
}

func anthropicError(kind, msg string) map[string]any {
	return map[string]any{"type": "error", "error": map[string]any{"type": kind, "message": msg}}
}
