package redlimitotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/extra/redlimitotel"
)

// BenchmarkDecision measures a decision made in-process (a deny-cache
// denial, no round trip), without an observer and with this package's: the
// difference is the observer's cost per decision.
func BenchmarkDecision(b *testing.B) {
	mr := miniredis.RunT(b)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	b.Cleanup(func() { rdb.Close() })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := redlimitotel.New(redlimitotel.WithMeterProvider(mp))
	require.NoError(b, err)
	for _, c := range []struct {
		name string
		opts []redlimit.Option
	}{
		{"observer=none", nil},
		{"observer=redlimitotel", m.Options("bench")},
	} {
		b.Run(c.name, func(b *testing.B) {
			lim, err := redlimit.NewTokenBucket(rdb, redlimit.Limit{Rate: 1, Period: time.Hour},
				append(c.opts, redlimit.WithDenyCache(100))...)
			require.NoError(b, err)
			defer lim.Close()
			ctx := context.Background()
			for range 2 { // the second call is denied and fills the deny cache
				_, err := lim.Allow(ctx, "k")
				require.NoError(b, err)
			}
			b.ReportAllocs()
			for b.Loop() {
				res, err := lim.Allow(ctx, "k")
				if err != nil || res.Allowed {
					b.Fatal(res, err)
				}
			}
		})
	}
}
