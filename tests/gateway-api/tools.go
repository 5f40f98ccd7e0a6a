//go:build tools

// Package tools keeps the Gateway API conformance suite (built by build.sh with
// `go test -c sigs.k8s.io/gateway-api/conformance`) and its dependencies in go.mod and go.sum.
// echo-basic, a program, is kept by the `tool` line of go.mod.
package tools

import _ "sigs.k8s.io/gateway-api/conformance"
