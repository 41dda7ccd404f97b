//go:build tools

// Package tools pins the versions of the development tools that ./test.sh
// runs (the linter, through .ci/lint.sh). It is a module of its own so that
// the library's modules do not gain the tools' dependencies, and it is not
// released with them.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
