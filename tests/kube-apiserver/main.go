// Command kube-apiserver runs a real Kubernetes API server for sluice's tests: embedded etcd plus
// k8s.io/kubernetes' kube-apiserver, both as libraries, in one process.
//
// Protocol (see README.md): when the server answers /readyz it writes DIR/kubeconfig and prints
// exactly one line, "READY https://ADDR:PORT", to stdout. Logs go to stderr. SIGTERM/SIGINT (or
// EOF on stdin, unless --watch-stdin=false) shut it down and it exits 0.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
	_ "time/tzdata" // as upstream's main: CronJob time zones validate without system tzdata

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(run())
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kube-apiserver(test): "+format+"\n", args...)
}

func run() int {
	fs := flag.NewFlagSet(os.Args[0], flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s --dir DIR [flags] [-- extra kube-apiserver flags]\n", os.Args[0])
		fs.PrintDefaults()
	}
	dir := fs.String("dir", "", "work directory owned by this process: etcd data, certs, keys, token file, kubeconfig (required)")
	address := fs.String("address", "127.0.0.1", "IP address the API server binds to and advertises")
	port := fs.Int("port", 0, "secure port; 0 picks a free port on --address")
	token := fs.String("token", "", "bearer token of the admin user (user admin, group system:masters); default random")
	watchStdin := fs.Bool("watch-stdin", true, "shut down when stdin reaches EOF (the parent closed it or died)")
	dieWithParent := fs.Bool("die-with-parent", false, "Linux: get SIGTERM when the parent thread exits (prctl PR_SET_PDEATHSIG)")
	readyTimeout := fs.Duration("ready-timeout", 3*time.Minute, "give up (exit 1) if /readyz is not 200 by then")
	etcdLogLevel := fs.String("etcd-log-level", "error", "embedded etcd's log level: debug, info, warn, error")
	keepCert := fs.Bool("keep-serving-cert", false, "reuse DIR's serving certificate from an earlier start (a restart on the same address and port: clients keep trusting it)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	extra := fs.Args() // after "--": passed to kube-apiserver last, so they override ours
	if *dir == "" {
		logf("--dir is required")
		return 2
	}
	ip := net.ParseIP(*address)
	if ip == nil {
		logf("--address %q is not an IP address", *address)
		return 2
	}

	if *dieWithParent {
		// The signal fires when the parent *thread* that forked us exits.
		if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0); errno != 0 {
			logf("prctl(PR_SET_PDEATHSIG): %v", errno)
			return 1
		}
		if os.Getppid() == 1 {
			logf("parent already gone")
			return 1
		}
	}
	if *watchStdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			logf("stdin closed: shutting down")
			// Before the API server installs its handler this kills the process (etcd with it);
			// after, it starts the same graceful shutdown as a SIGTERM from outside.
			_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		}()
	}

	workDir, err := filepath.Abs(*dir)
	if err != nil {
		logf("%v", err)
		return 1
	}
	files, err := prepare(workDir, ip, *port, *token, *keepCert)
	if err != nil {
		logf("%v", err)
		return 1
	}

	etcdLevel, err := zapcore.ParseLevel(*etcdLogLevel)
	if err != nil {
		logf("--etcd-log-level: %v", err)
		return 2
	}
	etcdLog := zap.NewAtomicLevelAt(etcdLevel)
	etcd, err := startEtcd(filepath.Join(workDir, "etcd"), etcdLog)
	if err != nil {
		logf("etcd: %v", err)
		return 1
	}
	etcdURL := etcd.Clients[0].Addr().String()

	args := []string{
		"--etcd-servers=http://" + etcdURL,
		"--bind-address=" + ip.String(),
		"--advertise-address=" + ip.String(),
		"--secure-port=" + strconv.Itoa(files.port),
		"--cert-dir=" + files.certDir,
		"--service-account-key-file=" + files.saKey,
		"--service-account-signing-key-file=" + files.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--token-auth-file=" + files.tokenFile,
		// The default (lease) reconciler refuses loopback advertise addresses, and there is no
		// real endpoint behind the "kubernetes" Service anyway.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		// Shut down in ~2 s even with watches open (default: up to --request-timeout, 60 s):
		// in-flight short requests drain, then open connections get 2 s.
		"--shutdown-send-retry-after=true",
		"--v=0",
	}
	args = append(args, extra...)

	cmd := app.NewAPIServerCommand() // installs the SIGTERM/SIGINT handler (once per process)
	cmd.SetArgs(args)
	cmd.SetOut(os.Stderr)
	cmd.SetErr(os.Stderr)

	exited := make(chan struct{})
	go func() {
		server := "https://" + net.JoinHostPort(ip.String(), strconv.Itoa(files.port))
		caPEM, err := waitReady(server, files, *readyTimeout, exited)
		if err != nil {
			select {
			case <-exited:
				return // the server failed; main reports it
			default:
			}
			logf("%v", err)
			os.Exit(1) // etcd and the API server are in this process: nothing is left behind
		}
		if err := writeKubeconfig(filepath.Join(workDir, "kubeconfig"), server, caPEM, files.token); err != nil {
			logf("kubeconfig: %v", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stdout, "READY %s\n", server)
	}()

	runErr := cli.RunNoErrOutput(cmd)
	close(exited)
	// Closing logs each listener's "use of closed network connection" at error level: not news.
	etcdLog.SetLevel(zapcore.FatalLevel)
	etcd.Close()
	if runErr != nil {
		logf("kube-apiserver: %v", runErr)
		return 1
	}
	logf("stopped")
	return 0
}

type workFiles struct {
	port      int
	certDir   string
	caFile    string // the self-signed serving chain that the API server writes
	saKey     string
	tokenFile string
	token     string
}

// prepare lays out DIR. Etcd data and the service-account key survive a restart on the same DIR
// (objects and issued tokens stay valid); the token file and the kubeconfig are made anew each
// start (the token may have changed), and so is the serving certificate unless keepCert (the
// address may have changed; a restart on the same address keeps it, so clients still trust it).
func prepare(dir string, ip net.IP, port int, token string, keepCert bool) (*workFiles, error) {
	f := &workFiles{
		certDir:   filepath.Join(dir, "certs"),
		saKey:     filepath.Join(dir, "sa.key"),
		tokenFile: filepath.Join(dir, "tokens.csv"),
		token:     token,
	}
	f.caFile = filepath.Join(f.certDir, "apiserver.crt")
	if err := os.MkdirAll(f.certDir, 0o700); err != nil {
		return nil, err
	}
	stale := []string{filepath.Join(dir, "kubeconfig")}
	if !keepCert {
		stale = append(stale, f.caFile, filepath.Join(f.certDir, "apiserver.key"))
	}
	for _, stale := range stale {
		if err := os.Remove(stale); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	if _, err := os.Stat(f.saKey); errors.Is(err, os.ErrNotExist) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(f.saKey, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if f.token == "" {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		f.token = hex.EncodeToString(b)
	}
	// token,user,uid,"group,..."
	line := fmt.Sprintf("%s,admin,admin,\"system:masters\"\n", f.token)
	if err := os.WriteFile(f.tokenFile, []byte(line), 0o600); err != nil {
		return nil, err
	}
	f.port = port
	if f.port == 0 {
		p, err := freePort(ip)
		if err != nil {
			return nil, err
		}
		f.port = p
	}
	return f, nil
}

// freePort asks the kernel for a free port. Another process could take it before the API server
// binds it; the window is milliseconds.
func freePort(ip net.IP) (int, error) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd runs a single-member etcd on free loopback ports (client and peer).
func startEtcd(dataDir string, level zap.AtomicLevel) (*embed.Etcd, error) {
	var ports [2]int
	for i := range ports {
		p, err := freePort(net.IPv4(127, 0, 0, 1))
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))}

	cfg := embed.NewConfig()
	cfg.Dir = dataDir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true // test data: speed over durability
	zcfg := zap.NewProductionConfig()
	zcfg.Level = level
	zcfg.Encoding = "console"
	zcfg.DisableStacktrace = true
	zcfg.OutputPaths = []string{"stderr"}
	zcfg.ErrorOutputPaths = []string{"stderr"}
	lg, err := zcfg.Build()
	if err != nil {
		return nil, err
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg.Named("etcd"))

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		e.Close()
		return nil, errors.New("not ready after 60s")
	}
	go func() {
		if err, ok := <-e.Err(); ok && err != nil {
			logf("etcd: %v", err)
		}
	}()
	return e, nil
}

// waitReady polls SERVER/readyz as the admin until it answers 200, verifying the serving
// certificate against the CA the API server generated. It returns that CA (PEM).
func waitReady(server string, f *workFiles, timeout time.Duration, exited <-chan struct{}) ([]byte, error) {
	deadline := time.Now().Add(timeout)
	var lastErr error = errors.New("serving certificate not written yet")
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return nil, errors.New("API server exited")
		case <-time.After(100 * time.Millisecond):
		}
		chain, err := os.ReadFile(f.caFile)
		if err != nil {
			continue
		}
		caPEM := caFromChain(chain)
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			lastErr = fmt.Errorf("no certificate in %s", f.caFile)
			continue
		}
		client := &http.Client{
			Timeout:   5 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+f.token)
		resp, err := client.Do(req)
		client.CloseIdleConnections()
		if err != nil {
			lastErr = err
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return caPEM, nil
		}
		lastErr = fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil, fmt.Errorf("not ready after %s: %v", timeout, lastErr)
}

// caFromChain picks the CA out of apiserver.crt (the serving certificate followed by the
// self-signed CA that signed it). Falls back to the whole file.
func caFromChain(chain []byte) []byte {
	rest := chain
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return chain
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err == nil && cert.IsCA {
			return pem.EncodeToMemory(block)
		}
	}
}

func writeKubeconfig(path, server string, caPEM []byte, token string) error {
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: test
  context:
    cluster: test
    user: admin
    namespace: default
current-context: test
`, server, base64.StdEncoding.EncodeToString(caPEM), token)
	// Write then rename: a reader never sees half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(kubeconfig), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
