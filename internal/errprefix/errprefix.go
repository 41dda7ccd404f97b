// Package errprefix formats a package's errors so that each message names
// the package once: "redlimit: reserve n = 5000: n exceeds the limit", not
// "redlimit: reserve n = 5000: redlimit: n exceeds the limit".
//
// The rule: a package's sentinels keep the prefix (they are returned alone
// too), and every message made by Errorf starts with it once; the prefix
// that starts a wrapped error's text is dropped from the message, while
// errors.Is and errors.As see the wrapped error as before.
package errprefix

import (
	"fmt"
	"strings"
)

// Errorf is fmt.Errorf(prefix+format, args...), with prefix dropped from
// the start of the text of every error among args.
func Errorf(prefix, format string, args ...any) error {
	var own []any // a copy, made at the first error that needs trimming
	for i, a := range args {
		err, ok := a.(error)
		if !ok || err == nil {
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, prefix) {
			continue
		}
		if own == nil {
			own = append([]any(nil), args...)
		}
		own[i] = &trimmed{msg: msg[len(prefix):], err: err}
	}
	if own != nil {
		args = own
	}
	return fmt.Errorf(prefix+format, args...)
}

// trimmed is err with its text shortened to msg.
type trimmed struct {
	msg string
	err error
}

func (t *trimmed) Error() string { return t.msg }
func (t *trimmed) Unwrap() error { return t.err }
