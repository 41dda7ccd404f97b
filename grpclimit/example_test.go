package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// A health server allows two calls a second per API key. The third call of
// key "alice" fails with ResourceExhausted and a RetryInfo detail; the
// client reads how long to wait from it.
func Example() {
	m, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	m.SetTime(windowStart) // 250ms into a second, for a stable output
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerSecond(2))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	byKey := grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-api-key"))
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, byKey)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(lim, byKey)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 16)
	go func() { _ = srv.Serve(lis) }() // nil once stopped
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "alice")
	for range 3 {
		var header metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		st := status.Convert(err)
		fmt.Printf("%v, remaining %s", st.Code(), header.Get(grpclimit.HeaderRemaining))
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Printf(", retry in %v", ri.GetRetryDelay().AsDuration())
			}
		}
		fmt.Println()
	}
	// Output:
	// OK, remaining [1]
	// OK, remaining [0]
	// ResourceExhausted, remaining [0], retry in 750ms
}

// With WithPerMethod, each registered method has its own limit (here 1 call
// a second per client), and calls to methods the server never registered,
// which a proxy's grpc.UnknownServiceHandler takes under any name the
// client sends, share one limit per client, under UnknownMethod: making up
// names gets no fresh limit and adds no key to Redis.
func ExampleWithPerMethod() {
	m, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	m.SetTime(windowStart)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerSecond(1))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	perMethod := grpclimit.WithPerMethod()
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, perMethod)),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(lim, perMethod)),
		// A proxy's handler: here it answers every call itself.
		grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
			var req healthpb.HealthCheckRequest
			if err := ss.RecvMsg(&req); err != nil {
				return err
			}
			return ss.SendMsg(&healthpb.HealthCheckResponse{})
		}),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 16)
	go func() { _ = srv.Serve(lis) }() // nil once stopped
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	ctx := context.Background()
	for _, method := range []string{
		healthpb.Health_Check_FullMethodName, healthpb.Health_Check_FullMethodName,
		"/made.Up/Name1", "/made.Up/Name2", "/made.Up/Name3",
	} {
		err := conn.Invoke(ctx, method, &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
		fmt.Println(method, status.Code(err))
	}
	fmt.Println(len(m.Keys()), "keys in Redis")
	// Output:
	// /grpc.health.v1.Health/Check OK
	// /grpc.health.v1.Health/Check ResourceExhausted
	// /made.Up/Name1 OK
	// /made.Up/Name2 ResourceExhausted
	// /made.Up/Name3 ResourceExhausted
	// 2 keys in Redis
}
