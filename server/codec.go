package server

import (
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	protov2 "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	admissionv1 "github.com/polygate/polygate/gen/polygate/admission/v1"
)

// undecodableField marks a request that did not decode: an unknown field of
// the highest field number, holding the name of the offending field.
const undecodableField protowire.Number = protowire.MaxValidNumber

// undecodableRequests counts the admission requests that did not decode.
var undecodableRequests atomic.Uint64

// CodecOption makes the server decode with codec: gRPC's own codec answers
// a request it cannot decode (invalid UTF-8 in a string, malformed bytes)
// with INTERNAL and no details, before any interceptor sees it.
func CodecOption() grpc.ServerOption {
	return grpc.ForceServerCodecV2(codec{encoding.GetCodecV2(proto.Name)})
}

// codec is gRPC's proto codec, except that an admission request that does
// not decode reaches the handler chain empty and marked (undecodableField),
// so that validation answers INVALID_ARGUMENT with an ErrorInfo naming the
// field, the interceptors log it (bounded) and the metrics count it.
type codec struct{ encoding.CodecV2 }

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		if m, ok := v.(protov2.Message); ok && len(m.ProtoReflect().GetUnknown()) > 0 {
			// A request's own field of the mark's number is unknown to the
			// API and ignored as any other: it must not read as the mark.
			m.ProtoReflect().SetUnknown(withoutField(m.ProtoReflect().GetUnknown(), undecodableField))
		}
		return nil
	}
	m, ok := v.(protov2.Message)
	if !ok || !admissionMessage(m.ProtoReflect().Descriptor()) {
		return err
	}
	field := invalidUTF8Field(data.Materialize(), m.ProtoReflect().Descriptor())
	protov2.Reset(m)
	mark := protowire.AppendTag(nil, undecodableField, protowire.BytesType)
	m.ProtoReflect().SetUnknown(protowire.AppendString(mark, field))
	undecodableRequests.Add(1)
	return nil
}

func admissionMessage(d protoreflect.MessageDescriptor) bool {
	return d.ParentFile().Package() == admissionv1.File_polygate_admission_v1_admission_proto.Package()
}

// invalidUTF8Field names the first top-level string field of b that is not valid
// UTF-8, or "request" when the bytes do not parse at all.
func invalidUTF8Field(b []byte, d protoreflect.MessageDescriptor) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "request"
		}
		b = b[n:]
		if f := d.Fields().ByNumber(num); f != nil && f.Kind() == protoreflect.StringKind && typ == protowire.BytesType {
			s, m := protowire.ConsumeBytes(b)
			if m >= 0 && !utf8.Valid(s) {
				return string(f.Name())
			}
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return "request"
		}
		b = b[n:]
	}
	return "request"
}

// withoutField is raw (unknown fields, which decoded) without those of
// number num.
func withoutField(raw protoreflect.RawFields, num protowire.Number) protoreflect.RawFields {
	var out protoreflect.RawFields
	for len(raw) > 0 {
		n, typ, tn := protowire.ConsumeTag(raw)
		vn := protowire.ConsumeFieldValue(n, typ, raw[max(tn, 0):])
		if tn < 0 || vn < 0 {
			return out // cannot happen: they decoded
		}
		if n != num {
			out = append(out, raw[:tn+vn]...)
		}
		raw = raw[tn+vn:]
	}
	return out
}

// undecodable reports the field a request marked by the codec could not
// decode.
func undecodable(req any) (string, bool) {
	m, ok := req.(protov2.Message)
	if !ok {
		return "", false
	}
	raw := m.ProtoReflect().GetUnknown()
	for len(raw) > 0 {
		num, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return "", false
		}
		raw = raw[n:]
		if num == undecodableField && typ == protowire.BytesType {
			s, m := protowire.ConsumeBytes(raw)
			if m < 0 {
				return "request", true
			}
			if len(s) > 64 || !utf8.Valid(s) {
				return "request", true // not a name this codec wrote
			}
			return string(s), true
		}
		n = protowire.ConsumeFieldValue(num, typ, raw)
		if n < 0 {
			return "", false
		}
		raw = raw[n:]
	}
	return "", false
}
