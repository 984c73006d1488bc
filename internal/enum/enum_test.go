package enum

import "testing"

type color uint8

func TestString(t *testing.T) {
	names := []string{1: "red", 2: "green"}
	for v, want := range map[color]string{1: "red", 2: "green", 0: "color(0)", 3: "color(3)", 255: "color(255)"} {
		if got := String(v, names); got != want {
			t.Errorf("String(%d) = %q, want %q", v, got, want)
		}
	}
}
