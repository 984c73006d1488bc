// Package enum names the values of small integer enums from a table.
package enum

import (
	"fmt"
	"reflect"
)

// String is names[v], or Type(v) for a value without a name (outside the
// table, or an empty entry).
func String[T ~uint8](v T, names []string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", reflect.TypeOf(v).Name(), uint8(v))
}
