package grpclimit

import (
	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
	"google.golang.org/grpc/metadata"
)

// Metadata returns the rate-limit header metadata for res, a decision of
// l, as the interceptors set them: [HeaderPolicy] (every rule of a
// [redlimit.Policy], in order), [HeaderLimit], [HeaderRemaining] and
// [HeaderReset] of the rule that decided (Result.Rule), and on a denial
// [HeaderRetryAfter]. It is for handlers that decide themselves, with
// their own Reserve or AllowN: grpc.SetHeader(ctx, grpclimit.Metadata(p,
// res)) before the first response message. gRPC adds to the values
// already set under a name, so give the interceptor in front
// [WithoutHeaders] when the handler sets these. A Policy with
// [redlimit.WithRulesFunc] lists its own rules, not the call's.
func Metadata(l redlimit.Limiter, res redlimit.Result) metadata.MD {
	in := interceptor{policies: ratelimitfields.NewSource(l, "", false, httplimit.DefaultPolicyName)}
	return in.headers(res, nil)
}
