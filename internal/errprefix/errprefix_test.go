package errprefix

import (
	"errors"
	"fmt"
	"testing"
)

var errSentinel = errors.New("pkg: broken")

type typed struct{ code int }

func (t *typed) Error() string { return fmt.Sprintf("pkg: typed %d", t.code) }

func TestErrorf(t *testing.T) {
	inner := Errorf("pkg: ", "inner %d: %w", 1, errSentinel)
	tests := []struct {
		err  error
		want string
	}{
		{Errorf("pkg: ", "n = %d: %w", 5, errSentinel), "pkg: n = 5: broken"},
		{Errorf("pkg: ", "outer: %w", inner), "pkg: outer: inner 1: broken"},
		{Errorf("pkg: ", "two: %w: %w", errSentinel, errors.New("other: cause")), "pkg: two: broken: other: cause"},
		{Errorf("pkg: ", "as value: %v", errSentinel), "pkg: as value: broken"},
		{Errorf("pkg: ", "typed: %w", &typed{7}), "pkg: typed: typed 7"},
		{Errorf("pkg: ", "no error %q", "pkg: text"), `pkg: no error "pkg: text"`},
		{Errorf("pkg: ", "nil: %v", error(nil)), "pkg: nil: <nil>"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
	if !errors.Is(tests[0].err, errSentinel) || !errors.Is(tests[1].err, errSentinel) || !errors.Is(tests[2].err, errSentinel) {
		t.Errorf("errors.Is lost the sentinel")
	}
	var ty *typed
	if !errors.As(tests[4].err, &ty) || ty.code != 7 {
		t.Errorf("errors.As lost the typed error: %v", ty)
	}
}
