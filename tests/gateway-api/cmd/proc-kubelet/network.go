package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

// ipPool hands out pod addresses from the pod range, lowest first, never the network address,
// the broadcast address or the gateway (the bridge's own address).
type ipPool struct {
	mu      sync.Mutex
	network *net.IPNet
	gateway net.IP
	used    map[uint32]string // address -> owner ("namespace/name")
}

func newIPPool(network *net.IPNet, gateway net.IP) *ipPool {
	return &ipPool{network: network, gateway: gateway.To4(), used: map[uint32]string{}}
}

func (p *ipPool) take(owner string) (net.IP, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	base := binary.BigEndian.Uint32(p.network.IP.To4())
	ones, bits := p.network.Mask.Size()
	size := uint32(1) << uint(bits-ones)
	gw := binary.BigEndian.Uint32(p.gateway)
	for off := uint32(1); off+1 < size; off++ {
		a := base + off
		if a == gw {
			continue
		}
		if _, taken := p.used[a]; !taken {
			p.used[a] = owner
			ip := make(net.IP, 4)
			binary.BigEndian.PutUint32(ip, a)
			return ip, nil
		}
	}
	return nil, fmt.Errorf("no free address left in %s", p.network)
}

func (p *ipPool) release(ip net.IP) {
	if ip4 := ip.To4(); ip4 != nil {
		p.mu.Lock()
		delete(p.used, binary.BigEndian.Uint32(ip4))
		p.mu.Unlock()
	}
}

// vethName is the host side of a pod's veth: "pk" and 12 hex digits of the pod UID (interface
// names are at most 15 bytes).
func vethName(uid string) string {
	hex := strings.ReplaceAll(uid, "-", "")
	if len(hex) > 12 {
		hex = hex[:12]
	}
	return "pk" + hex
}

// attachPod gives the network namespace of process pid an eth0 on the bridge:
//
//	host netns:  hostIf (veth) -- master bridge, up
//	pod netns:   lo up; eth0 = ip/prefix, up; default via gateway
//
// The process was started with CLONE_NEWNET and may already listen on wildcard addresses: a
// wildcard bind needs no interface, and it starts receiving once eth0 is up.
func attachPod(pid int, hostIf, bridge string, ip net.IP, network *net.IPNet, gateway net.IP) error {
	ones, _ := network.Mask.Size()
	podNet := "--net=/proc/" + strconv.Itoa(pid) + "/ns/net"
	steps := [][]string{
		// The peer is created directly inside the pod's namespace, already called eth0.
		{"ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(pid)},
		{"ip", "link", "set", hostIf, "master", bridge, "up"},
		{"nsenter", podNet, "ip", "link", "set", "lo", "up"},
		{"nsenter", podNet, "ip", "addr", "add", fmt.Sprintf("%s/%d", ip, ones), "dev", "eth0"},
		{"nsenter", podNet, "ip", "link", "set", "eth0", "up"},
		{"nsenter", podNet, "ip", "route", "add", "default", "via", gateway.String()},
	}
	for _, s := range steps {
		if err := command(s...); err != nil {
			detachPod(hostIf)
			return err
		}
	}
	return nil
}

// detachPod removes the host side of a pod's veth (which removes the peer too). Once the pod's
// process is gone its namespace goes with it, and the veth with that; this makes it immediate.
func detachPod(hostIf string) {
	if _, err := net.InterfaceByName(hostIf); err == nil {
		_ = command("ip", "link", "del", hostIf)
	}
}

func command(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = err.Error()
		}
		return errors.New(strings.Join(args, " ") + ": " + msg)
	}
	return nil
}
