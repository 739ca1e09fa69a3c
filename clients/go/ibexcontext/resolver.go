package ibexcontext

import (
	"context"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/resolver"
)

// DefaultResolveEvery is how often a dns: target is resolved again, the Python
// client's period (ContextClient's refresh_seconds): pods the HPA adds get calls
// within it, without waiting for a connection to drop.
const DefaultResolveEvery = 30 * time.Second

const (
	// defaultPort is the service's port, when the target names none (the Python
	// client's DEFAULT_PORT).
	defaultPort = "50051"
	// minResolveGap spaces the lookups grpc asks for (ResolveNow, after every
	// failed connection): pods that keep refusing must not turn into a DNS flood.
	minResolveGap = time.Second
	// lookupTimeout bounds one lookup; a DNS server that does not answer leaves the
	// addresses as they were.
	lookupTimeout = 10 * time.Second
)

// refreshingDNS resolves a dns: target ("dns:///name:port", or
// "dns://dns-server:53/name:port" to ask that server) like grpc-go's own DNS
// resolver, and again every `every`: grpc-go's resolves only when a connection
// fails, so a client would never call the pods added after it connected. Only
// the addresses are resolved (no SRV or service config records: the client sets
// its own round robin). A lookup that fails or finds nothing keeps the addresses
// of the last good one: a DNS blip must not take the service away.
type refreshingDNS struct {
	every time.Duration
}

func (refreshingDNS) Scheme() string { return "dns" }

func (b refreshingDNS) Build(target resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	host, port, err := splitHostPort(target.Endpoint())
	if err != nil {
		return nil, err
	}
	if net.ParseIP(host) != nil {
		// An address, not a name: nothing to resolve, ever.
		// (A state grpc's balancer rejects comes back as an error; the calls say why.)
		_ = cc.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: net.JoinHostPort(host, port)}}})
		return nopResolver{}, nil
	}
	lookup := net.DefaultResolver
	if server := target.URL.Host; server != "" {
		if _, _, err := net.SplitHostPort(server); err != nil {
			server = net.JoinHostPort(strings.Trim(server, "[]"), "53")
		}
		dialer := net.Dialer{}
		lookup = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, server)
		}}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &dnsResolver{
		host: host, port: port, every: b.every, lookup: lookup, cc: cc,
		now: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}),
	}
	go r.run(ctx)
	return r, nil
}

// splitHostPort reads "name:port", "name", "[v6]:port" or "[v6]".
func splitHostPort(endpoint string) (host, port string, err error) {
	if endpoint == "" {
		return "", "", errEmptyTarget
	}
	if host, port, err = net.SplitHostPort(endpoint); err == nil {
		if host == "" {
			return "", "", errEmptyTarget
		}
		return host, port, nil
	}
	// No port (or an IPv6 literal without one): the service's default.
	return strings.Trim(endpoint, "[]"), defaultPort, nil
}

type dnsResolver struct {
	host, port string
	every      time.Duration
	lookup     *net.Resolver
	cc         resolver.ClientConn
	now        chan struct{}
	cancel     context.CancelFunc
	done       chan struct{}
	last       []string // the addresses last given to grpc, sorted (run's goroutine only)
}

func (r *dnsResolver) run(ctx context.Context) {
	defer close(r.done)
	ticker := time.NewTicker(r.every)
	defer ticker.Stop()
	for {
		r.resolve(ctx)
		resolved := time.Now()
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-r.now:
			// Asked for after a failed connection: at once, unless the last
			// lookup was less than minResolveGap ago.
			if wait := minResolveGap - time.Since(resolved); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		}
	}
}

func (r *dnsResolver) resolve(closed context.Context) {
	ctx, cancel := context.WithTimeout(closed, lookupTimeout)
	defer cancel()
	found, err := r.lookup.LookupHost(ctx, r.host)
	if closed.Err() != nil {
		return // the resolver closed during the lookup
	}
	if err != nil || len(found) == 0 {
		if r.last == nil {
			// Nothing known yet: grpc fails the calls (UNAVAILABLE) and asks again.
			if err == nil {
				err = &net.DNSError{Err: "no addresses", Name: r.host, IsNotFound: true}
			}
			r.cc.ReportError(err)
		}
		return
	}
	addresses := make([]string, len(found))
	for i, ip := range found {
		addresses[i] = net.JoinHostPort(ip, r.port)
	}
	slices.Sort(addresses)
	addresses = slices.Compact(addresses)
	if slices.Equal(addresses, r.last) {
		return
	}
	r.last = addresses
	state := resolver.State{Addresses: make([]resolver.Address, len(addresses))}
	for i, address := range addresses {
		state.Addresses[i] = resolver.Address{Addr: address}
	}
	_ = r.cc.UpdateState(state) // a rejected state: the calls say why
}

// ResolveNow asks for a lookup soon (grpc calls it when a connection fails).
func (r *dnsResolver) ResolveNow(resolver.ResolveNowOptions) {
	select {
	case r.now <- struct{}{}:
	default:
	}
}

func (r *dnsResolver) Close() {
	r.cancel()
	<-r.done
}

type nopResolver struct{}

func (nopResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (nopResolver) Close()                                {}
