package agentsim

import (
	"encoding/json"
	"net/http"
	"strings"
)

// The parts of a Gemini generateContent request the Server reads.
type geminiRequest struct {
	Contents []geminiContent `json:"contents"`
	Tools    []struct {
		FunctionDeclarations []struct {
			Name string `json:"name"`
		} `json:"functionDeclarations"`
	} `json:"tools"`
}

type geminiContent struct {
	Role  string       `json:"role"`
	Parts []geminiPart `json:"parts"`
}

type geminiPart struct {
	Text             string `json:"text"`
	FunctionResponse *struct {
		ID       string          `json:"id"`
		Name     string          `json:"name"`
		Response json.RawMessage `json:"response"`
	} `json:"functionResponse"`
}

// geminiConversation finds the latest user prompt and the function
// responses after it. As for Anthropic, a prompt is user content with text
// and no functionResponse part.
func geminiConversation(contents []geminiContent) (prompt string, results []ToolResult) {
	for _, c := range contents {
		if c.Role != "user" {
			continue
		}
		var texts []string
		var rs []ToolResult
		for _, p := range c.Parts {
			if p.FunctionResponse != nil {
				fr := p.FunctionResponse
				rs = append(rs, ToolResult{ID: fr.ID, Name: fr.Name, Output: geminiOutput(fr.Response)})
			} else if p.Text != "" {
				texts = append(texts, p.Text)
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

// geminiOutput is a function response as text: Gemini CLI wraps a tool's
// output as {"output": "..."}; anything else stays raw JSON.
func geminiOutput(raw json.RawMessage) string {
	var r struct {
		Output *string `json:"output"`
	}
	if json.Unmarshal(raw, &r) == nil && r.Output != nil {
		return *r.Output
	}
	return string(raw)
}

// gemini answers POST /v1beta/models/MODEL:METHOD. Gemini CLI streams
// (streamGenerateContent?alt=sse, one "data:" event per chunk and no
// "event:" lines); generateContent gets the same reply as one JSON object,
// and countTokens a rough count.
func (s *Server) gemini(w http.ResponseWriter, r *http.Request, body []byte) {
	rest := strings.TrimPrefix(r.URL.Path, "/v1beta/models/")
	model, method, ok := strings.Cut(rest, ":")
	if !ok {
		s.notFound(w, r, body)
		return
	}
	if method == "countTokens" {
		s.record(newRequest(APIGemini, r, body))
		writeJSON(w, http.StatusOK, map[string]any{"totalTokens": tokens(body)})
		return
	}
	if method != "generateContent" && method != "streamGenerateContent" {
		s.notFound(w, r, body)
		return
	}
	var req geminiRequest
	if err := json.Unmarshal(body, &req); err != nil {
		s.badBody(APIGemini, r, body, err)
		writeJSON(w, http.StatusBadRequest, geminiError(err.Error()))
		return
	}
	var tools []string
	for _, t := range req.Tools {
		for _, f := range t.FunctionDeclarations {
			tools = append(tools, f.Name)
		}
	}
	prompt, results := geminiConversation(req.Contents)
	step := s.choose(tools, prompt, len(results), "")
	stream := method == "streamGenerateContent"
	rec := newRequest(APIGemini, r, body)
	rec.Stream, rec.Tools, rec.Prompt, rec.Results, rec.Reply = stream, tools, prompt, results, step
	s.record(rec)

	var parts []any
	if step.Text != "" || len(step.Calls) == 0 {
		parts = append(parts, map[string]any{"text": step.Text})
	}
	for _, c := range step.Calls {
		call := map[string]any{"name": c.Name, "args": json.RawMessage(inputJSON(c.Input))}
		if c.ID != "" {
			call["id"] = c.ID
		}
		parts = append(parts, map[string]any{"functionCall": call})
	}
	reply := map[string]any{
		"candidates": []any{map[string]any{
			"content":      map[string]any{"role": "model", "parts": parts},
			"finishReason": "STOP",
			"index":        0,
		}},
		"usageMetadata": map[string]any{
			"promptTokenCount": tokens(body), "candidatesTokenCount": 1, "totalTokenCount": tokens(body) + 1,
		},
		"modelVersion": model,
	}
	if !stream {
		writeJSON(w, http.StatusOK, reply)
		return
	}
	if r.URL.Query().Get("alt") != "sse" {
		// Without alt=sse the API streams a JSON array of chunks.
		writeJSON(w, http.StatusOK, []any{reply})
		return
	}
	startSSE(w)
	writeEvent(w, "", reply)
}

func geminiError(msg string) map[string]any {
	return map[string]any{"error": map[string]any{"code": 400, "status": "INVALID_ARGUMENT", "message": msg}}
}
