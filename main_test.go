package redlimit

import (
	"context"
	"log"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the fault tests make many on purpose.
	redis.SetLogger(quietLogger{})
	log.SetFlags(0)
	os.Exit(m.Run())
}
