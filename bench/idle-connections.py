#!/usr/bin/env python3
"""Resident memory of N idle keep-alive connections: sluice (`sluice serve`, no routes, so each
connection's one request is answered 404 locally) against nginx (`return 404`), one worker each,
on loopback. Each connection sends one request, reads the answer and stays open; the script
prints the server's RSS (all its processes) before and after, and the cost per connection.

    bench/idle-connections.py 10000 sluice target/release/sluice
    bench/idle-connections.py 10000 nginx

The "after" figure is taken SETTLE seconds (default 15) after the last connection's answer: an
idle sluice connection gives its buffers back after a second, and jemalloc returns freed pages
to the system within about ten seconds more (its background thread's decay), as an idle
connection's life is measured in seconds to minutes. SETTLE=1 shows the memory of connections
that have just been answered.
"""
import asyncio, os, resource, subprocess, sys, time, signal, tempfile
N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; resource.setrlimit(resource.RLIMIT_NOFILE, (h, h))

def rss_kb(pids):
    t = 0
    for p in pids:
        try:
            for l in open(f"/proc/{p}/status"):
                if l.startswith("VmRSS:"):
                    t += int(l.split()[1])
        except FileNotFoundError:
            pass
    return t

def tree(pid):
    out = [pid]
    try:
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except FileNotFoundError:
        kids = []
    for k in kids:
        out += tree(int(k))
    return out

async def one(port, req):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(req)
    await w.drain()
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await r.read(4096)
        if not chunk:
            raise RuntimeError("closed")
        data += chunk
    return r, w

async def measure(name, port, pid, host):
    req = f"GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: idle-test\r\nAccept: */*\r\n\r\n".encode()
    await asyncio.sleep(0.5)
    base = rss_kb(tree(pid))
    conns = []
    sem = asyncio.Semaphore(200)
    async def go():
        async with sem:
            conns.append(await one(port, req))
    await asyncio.gather(*[go() for _ in range(N)])
    await asyncio.sleep(float(os.environ.get("SETTLE", "15")))
    loaded = rss_kb(tree(pid))
    print(f"{name}: {N} idle keep-alive connections: RSS {base/1024:.1f} MB -> {loaded/1024:.1f} MB, +{(loaded-base)/N:.2f} KB per connection", flush=True)
    for r, w in conns:
        w.close()

async def main():
    which = sys.argv[2]
    d = tempfile.mkdtemp()
    if which.startswith("sluice"):
        binary = sys.argv[3]
        open(f"{d}/m.yaml","w").write("apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata:\n  name: sluice\nspec:\n  controller: sluice.dev/ingress-controller\n")
        port = 18080
        p = subprocess.Popen([binary, "serve", "--manifests", d, "--http-listen", f"127.0.0.1:{port}", "--https-listen", "off", "--admin-listen", "127.0.0.1:18099", "--workers", "1", "--log-level", "error", "--max-connections", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        port = 18081
        open(f"{d}/nginx.conf","w").write(f"worker_processes 1;\nerror_log stderr error;\npid {d}/nginx.pid;\nevents {{ worker_connections 100000; }}\nhttp {{ access_log off; keepalive_timeout 75s; keepalive_requests 1000000; server {{ listen 127.0.0.1:{port} backlog=4096; location / {{ return 404; }} }} }}\n")
        p = subprocess.Popen(["nginx", "-c", f"{d}/nginx.conf", "-p", d, "-g", "daemon off; worker_rlimit_nofile 200000;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await measure(which, port, p.pid, "x.test")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()

asyncio.run(main())
