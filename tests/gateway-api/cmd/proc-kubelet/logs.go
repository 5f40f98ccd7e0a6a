package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Container output is kept one line per record, as a CRI runtime does:
//
//	<RFC 3339 time, UTC, nanoseconds> <stdout|stderr> <line>
//
// and served at /containerLogs/{namespace}/{pod}/{container}, which the API server proxies for
// `kubectl logs` and the suite's pods/log requests.

// logWriter appends a container's stdout and stderr to one file.
type logWriter struct {
	mu      sync.Mutex
	f       *os.File
	streams []*logStream
}

type logStream struct {
	w       *logWriter
	name    string
	partial []byte // an unfinished line
}

func newLogWriter(path string) (*logWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &logWriter{f: f}, nil
}

// stream returns the io.Writer of one stream ("stdout" or "stderr").
func (w *logWriter) stream(name string) io.Writer {
	s := &logStream{w: w, name: name}
	w.streams = append(w.streams, s)
	return s
}

func (s *logStream) Write(p []byte) (int, error) {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	data := append(s.partial, p...)
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		s.w.record(s.name, data[:i])
		data = data[i+1:]
	}
	s.partial = append([]byte(nil), data...)
	return len(p), nil
}

// record writes one line; called with mu held. A whole record is one write, so a reader never
// sees half of one unless it reads while the write happens (follow handles that).
func (w *logWriter) record(stream string, line []byte) {
	var b bytes.Buffer
	b.WriteString(time.Now().UTC().Format(time.RFC3339Nano))
	b.WriteByte(' ')
	b.WriteString(stream)
	b.WriteByte(' ')
	b.Write(line)
	b.WriteByte('\n')
	_, _ = w.f.Write(b.Bytes())
}

// Close writes unfinished lines and closes the file. Call it after the process's output has
// been copied (cmd.Wait returns after that).
func (w *logWriter) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.streams {
		if len(s.partial) > 0 {
			w.record(s.name, s.partial)
			s.partial = nil
		}
	}
	_ = w.f.Close()
}

// logOptions are the query parameters of /containerLogs that the API server passes on.
type logOptions struct {
	since      time.Time // zero: from the start
	timestamps bool
	tail       int // <0: all
	follow     bool
}

func parseLogOptions(r *http.Request) (logOptions, error) {
	q := r.URL.Query()
	o := logOptions{tail: -1}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return o, fmt.Errorf("sinceTime: %w", err)
		}
		o.since = t
	}
	if v := q.Get("tailLines"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return o, fmt.Errorf("tailLines: %w", err)
		}
		o.tail = n
	}
	o.timestamps = q.Get("timestamps") == "true"
	o.follow = q.Get("follow") == "true"
	return o, nil
}

// format turns one stored record into what the client gets, or "" if it is filtered out.
func (o *logOptions) format(record string) (string, bool) {
	ts, rest, ok := strings.Cut(record, " ")
	if !ok {
		return "", false
	}
	_, line, _ := strings.Cut(rest, " ") // drop the stream name
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil || t.Before(o.since) {
		return "", false
	}
	if o.timestamps {
		return ts + " " + line + "\n", true
	}
	return line + "\n", true
}

// serveLogs starts the HTTPS /containerLogs server with a fresh self-signed certificate. The API
// server does not verify a kubelet's certificate unless --kubelet-certificate-authority is set.
func serveLogs(addr string, k *kubelet) (*http.Server, error) {
	cert, err := selfSignedCert(addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", k.handleLogs)
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // TLS probes and closed connections are not news
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("log server: %w", err)
	}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Printf("log server: %v", err)
		}
	}()
	return srv, nil
}

func (k *kubelet) handleLogs(w http.ResponseWriter, req *http.Request) {
	key := req.PathValue("namespace") + "/" + req.PathValue("pod")
	container := req.PathValue("container")
	r := k.runner(key)
	if r == nil {
		http.Error(w, fmt.Sprintf("pod %s is not running on this node", key), http.StatusNotFound)
		return
	}
	opts, err := parseLogOptions(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	f, err := os.Open(r.logPath(container))
	if errors.Is(err, os.ErrNotExist) {
		return // not started yet, or no process (a faked image): no output
	} else if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()

	rd := bufio.NewReader(f)
	// What is there now; with tailLines, only the last n of the records that pass the filter.
	var kept []string
	var pending string // a record whose end is not written yet
	for {
		chunk, err := rd.ReadString('\n')
		if err != nil {
			pending = chunk
			break
		}
		if line, ok := opts.format(strings.TrimSuffix(chunk, "\n")); ok {
			kept = append(kept, line)
			if opts.tail >= 0 && len(kept) > opts.tail {
				kept = kept[1:]
			}
		}
	}
	for _, line := range kept {
		if _, err := io.WriteString(w, line); err != nil {
			return
		}
	}
	if !opts.follow {
		return
	}
	// follow: send new records until the client goes or the pod's runner stops.
	flusher, _ := w.(http.Flusher)
	for {
		if flusher != nil {
			flusher.Flush()
		}
		select {
		case <-req.Context().Done():
			return
		case <-r.done:
			return
		case <-time.After(250 * time.Millisecond):
		}
		for {
			chunk, err := rd.ReadString('\n')
			pending += chunk
			if err != nil {
				break
			}
			if line, ok := opts.format(strings.TrimSuffix(pending, "\n")); ok {
				if _, err := io.WriteString(w, line); err != nil {
					return
				}
			}
			pending = ""
		}
	}
}

// selfSignedCert makes an ECDSA certificate for the listen address, valid for a year.
func selfSignedCert(addr string) (tls.Certificate, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "proc-kubelet"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "proc-node"},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
