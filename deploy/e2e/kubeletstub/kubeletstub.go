// Package kubeletstub is a light stand-in for the kubelet's side of a DRA
// driver: it finds the plugin's registration socket, registers it the way
// the kubelet's plugin manager does, and calls NodePrepareResources and
// NodeUnprepareResources over the plugin's unix socket. The crash matrix and
// the benchmarks use it where a whole node would only add noise.
package kubeletstub

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Plugin is a registered DRA plugin.
type Plugin struct {
	Name     string
	Endpoint string
	conn     *grpc.ClientConn
	client   drapb.DRAPluginClient
}

// Register waits (up to timeout) for a registration socket of driverName in
// registrarDir, registers the plugin and connects to its DRA service. Where
// several sockets exist (a rolling update), the newest wins, as with the
// kubelet.
func Register(ctx context.Context, registrarDir, driverName string, timeout time.Duration) (*Plugin, error) {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		p, err := register(ctx, registrarDir, driverName)
		if err == nil {
			return p, nil
		}
		lastErr = err
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("register %s from %s: %w", driverName, registrarDir, lastErr)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func register(ctx context.Context, registrarDir, driverName string) (*Plugin, error) {
	sockets, err := filepath.Glob(filepath.Join(registrarDir, "*-reg.sock"))
	if err != nil || len(sockets) == 0 {
		return nil, fmt.Errorf("no registration socket yet")
	}
	sort.Slice(sockets, func(i, j int) bool { return modTime(sockets[i]).After(modTime(sockets[j])) })
	for _, sock := range sockets {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			continue
		}
		reg := registerapi.NewRegistrationClient(conn)
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := reg.GetInfo(callCtx, &registerapi.InfoRequest{})
		cancel()
		if err != nil || info.Type != registerapi.DRAPlugin || info.Name != driverName {
			conn.Close()
			continue
		}
		callCtx, cancel = context.WithTimeout(ctx, 2*time.Second)
		_, err = reg.NotifyRegistrationStatus(callCtx, &registerapi.RegistrationStatus{PluginRegistered: true})
		cancel()
		conn.Close()
		if err != nil {
			continue
		}
		endpoint := info.Endpoint
		dra, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		return &Plugin{Name: info.Name, Endpoint: endpoint, conn: dra, client: drapb.NewDRAPluginClient(dra)}, nil
	}
	return nil, fmt.Errorf("no live registration socket among %s", strings.Join(sockets, ", "))
}

func modTime(path string) time.Time {
	st, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}

// Close drops the connection.
func (p *Plugin) Close() error { return p.conn.Close() }

// Claim names a claim as the kubelet does.
type Claim struct{ Namespace, Name, UID string }

func toPB(claims []Claim) []*drapb.Claim {
	out := make([]*drapb.Claim, len(claims))
	for i, c := range claims {
		out[i] = &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID}
	}
	return out
}

// Prepare calls NodePrepareResources and returns the per-claim results, or
// an error for a failed call or any failed claim.
func (p *Plugin) Prepare(ctx context.Context, claims ...Claim) (map[string]*drapb.NodePrepareResourceResponse, error) {
	resp, err := p.client.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: toPB(claims)})
	if err != nil {
		return nil, err
	}
	// As the kubelet does: a claim without an answer was skipped.
	if len(resp.Claims) != len(claims) {
		return resp.Claims, fmt.Errorf("NodePrepareResources skipped %d claims", len(claims)-len(resp.Claims))
	}
	for uid, r := range resp.Claims {
		if r.Error != "" {
			return resp.Claims, fmt.Errorf("claim %s: %s", uid, r.Error)
		}
	}
	return resp.Claims, nil
}

// Unprepare calls NodeUnprepareResources.
func (p *Plugin) Unprepare(ctx context.Context, claims ...Claim) error {
	resp, err := p.client.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: toPB(claims)})
	if err != nil {
		return err
	}
	if len(resp.Claims) != len(claims) {
		return fmt.Errorf("NodeUnprepareResources skipped %d claims", len(claims)-len(resp.Claims))
	}
	for uid, r := range resp.Claims {
		if r.Error != "" {
			return fmt.Errorf("claim %s: %s", uid, r.Error)
		}
	}
	return nil
}

// WatchHealth opens the plugin's device health stream, as the kubelet does,
// and returns each report as device name -> status.
func (p *Plugin) WatchHealth(ctx context.Context) (<-chan map[string]healthpb.HealthStatus, error) {
	stream, err := healthpb.NewDRAResourceHealthClient(p.conn).NodeWatchResources(ctx, &healthpb.NodeWatchResourcesRequest{})
	if err != nil {
		return nil, err
	}
	out := make(chan map[string]healthpb.HealthStatus)
	go func() {
		defer close(out)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			report := map[string]healthpb.HealthStatus{}
			for _, d := range resp.Devices {
				report[d.Device.DeviceName] = d.Health
			}
			select {
			case out <- report:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
