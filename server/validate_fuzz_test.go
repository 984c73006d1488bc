package server

import (
	"errors"
	"testing"

	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// FuzzValidate: any bytes, decoded as any admission request by the server's
// codec, are either accepted within the documented bounds or refused with a
// field error whose status message is bounded; never a panic.
func FuzzValidate(f *testing.F) {
	for _, m := range []proto.Message{
		&admissionv1.PickRequest{Scope: "chat", EstimatedTokens: 10},
		&admissionv1.RecordOutcomeRequest{Scope: "chat", CallId: "c-X", PermitId: "p-Y", Outcome: admissionv1.Outcome_OUTCOME_TRANSIENT, Detail: "503"},
		&admissionv1.RetryAfterRequest{Scope: "chat", Sources: []string{"a", "a"}},
		&admissionv1.OverrideBreakerRequest{Scope: "chat", Source: "a", Action: admissionv1.OverrideAction_OVERRIDE_ACTION_RESET, Actor: "me", Reason: "r"},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})
	c := codec{encoding.GetCodecV2(encproto.Name)}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []proto.Message{
			&admissionv1.PickRequest{}, &admissionv1.OnNoRunnableRequest{}, &admissionv1.RecordOutcomeRequest{},
			&admissionv1.CancelCallRequest{}, &admissionv1.RetryAfterRequest{}, &admissionv1.DescribeScopeRequest{},
			&admissionv1.OverrideBreakerRequest{}, &admissionv1.WatchEventsRequest{},
		} {
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m); err != nil {
				t.Fatalf("%T: the codec refused instead of marking: %v", m, err)
			}
			err := validate(m)
			if err != nil {
				var fe *fieldError
				if !errors.As(err, &fe) || fe.field == "" {
					t.Fatalf("%T: %v is not a field error", m, err)
				}
				if len(message(err)) > maxMessage+len("…") {
					t.Fatalf("%T: a status message of %d bytes", m, len(message(err)))
				}
				continue
			}
			switch r := m.(type) {
			case *admissionv1.PickRequest:
				if r.GetScope() == "" || len(r.GetScope()) > 63 || r.GetEstimatedTokens() < 0 || r.GetEstimatedTokens() > MaxTokens || len(r.GetCallId()) > maxID {
					t.Fatalf("accepted %v", r)
				}
			case *admissionv1.RecordOutcomeRequest:
				if r.GetPermitId() == "" || len(r.GetPermitId()) > maxID || len(r.GetDetail()) > maxDetail || r.GetRetryAfterHint().AsDuration() < 0 {
					t.Fatalf("accepted %v", r)
				}
			case *admissionv1.RetryAfterRequest:
				if len(r.GetSources()) > maxSourcesPerRequest {
					t.Fatalf("accepted %d sources", len(r.GetSources()))
				}
			}
		}
	})
}
