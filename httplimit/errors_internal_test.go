package httplimit

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

// Every error message names the package once: one wrapping ErrNoKey does
// not repeat "httplimit:".
func TestErrorMessagesOnePrefix(t *testing.T) {
	_, headerErr := HeaderKey("X-Api-Key")(httptest.NewRequest("GET", "/", nil))
	for name, err := range map[string]error{
		"empty key":      errEmptyKey,
		"missing header": headerErr,
	} {
		if err == nil || !errors.Is(err, ErrNoKey) {
			t.Fatalf("%s: err = %v, want one wrapping ErrNoKey", name, err)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "httplimit: ") || strings.Count(msg, "httplimit: ") != 1 {
			t.Errorf("%s: %q names the package %d times, want once, at the start", name, msg, strings.Count(msg, "httplimit: "))
		}
	}
}
