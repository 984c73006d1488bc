// Command openaigo is an application that calls an OpenAI-compatible API
// with the official openai-go client, governed by polygate's Transport: the
// Go end-to-end tests run it against the real sidecar and the fake upstream
// and read what it saw. It reads the sidecar's address and token from
// $POLYGATE_ADDR and $POLYGATE_TOKEN, as an application in the Kubernetes
// example does, and prints one JSON line describing the call's end.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	polygate "github.com/polygate/polygate/clientsdk/go"
)

// outcome is what the application saw.
type outcome struct {
	Content     string   `json:"content,omitempty"`
	Chunks      []string `json:"chunks,omitempty"`
	APIError    bool     `json:"api_error"` // a *openai.Error
	Status      int      `json:"status,omitempty"`
	Code        string   `json:"code,omitempty"`
	Message     string   `json:"message,omitempty"`
	Header      string   `json:"failure_reason_header,omitempty"`
	RetryAfter  string   `json:"retry_after_header,omitempty"`
	FailureOf   string   `json:"failure_of,omitempty"` // polygate.FailureOf's reason
	Unavailable bool     `json:"unavailable"`          // errors.Is(err, polygate.ErrUnavailable)
	Error       string   `json:"error,omitempty"`
	Ungoverned  int64    `json:"ungoverned_attempts"`
}

func main() {
	stream := flag.Bool("stream", false, "stream the completion")
	allow := flag.Bool("allow", false, "on_sidecar_unavailable: allow")
	fallback := flag.String("fallback", "", "the fallback source's base_url under -allow")
	flag.Parse()

	opts := []polygate.Option{}
	if *allow {
		opts = append(opts, polygate.WithOnSidecarUnavailable(polygate.SidecarAllow))
	}
	if *fallback != "" {
		opts = append(opts, polygate.WithFallback("chat", "fallback", map[string]string{"base_url": *fallback}))
	}
	pg, err := polygate.Dial("", opts...) // $POLYGATE_ADDR, $POLYGATE_TOKEN
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer pg.Close()
	client := openai.NewClient(
		option.WithBaseURL("http://polygate.invalid/"),
		option.WithAPIKey("sk-app"),
		option.WithHTTPClient(&http.Client{Transport: &polygate.Transport{Client: pg, Scope: "chat"}}),
		option.WithMaxRetries(0),
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	params := openai.ChatCompletionNewParams{Model: "x", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")}}

	var out outcome
	if *stream {
		s := client.Chat.Completions.NewStreaming(ctx, params)
		for s.Next() {
			if c := s.Current(); len(c.Choices) > 0 {
				out.Chunks = append(out.Chunks, c.Choices[0].Delta.Content)
			}
		}
		err = s.Err()
	} else {
		var completion *openai.ChatCompletion
		completion, err = client.Chat.Completions.New(ctx, params)
		if err == nil && len(completion.Choices) > 0 {
			out.Content = completion.Choices[0].Message.Content
		}
	}
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		out.APIError, out.Status, out.Code, out.Message = true, apiErr.StatusCode, apiErr.Code, apiErr.Message
		out.Header = apiErr.Response.Header.Get(polygate.HeaderFailureReason)
		out.RetryAfter = apiErr.Response.Header.Get(polygate.HeaderRetryAfter)
		if f, ok := polygate.FailureOf(apiErr.Response); ok {
			out.FailureOf = f.Reason.String()
		}
	} else if err != nil {
		out.Error = strings.TrimSpace(err.Error())
		out.Unavailable = errors.Is(err, polygate.ErrUnavailable)
	}
	out.Ungoverned = pg.UngovernedAttempts()
	json.NewEncoder(os.Stdout).Encode(out)
}
