module sluice.dev/bench/traefik-peer

go 1.26.0

tool github.com/traefik/traefik/v3/cmd/traefik

require github.com/traefik/traefik/v3 v3.6.12

// Traefik's own go.mod (v3.6.12) has these; replace and exclude directives only apply in the
// main module, so they are repeated here.

// Containous forks
replace (
	github.com/abbot/go-http-auth => github.com/containous/go-http-auth v0.4.1-0.20200324110947-a37a7636d23e
	github.com/gorilla/mux => github.com/containous/mux v0.0.0-20250523120546-41b6ec3aed59
	github.com/mailgun/minheap => github.com/containous/minheap v0.0.0-20190809180810-6e71eb837595
)

// ambiguous import: github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common/http in multiple modules
exclude github.com/tencentcloud/tencentcloud-sdk-go v3.0.83+incompatible
