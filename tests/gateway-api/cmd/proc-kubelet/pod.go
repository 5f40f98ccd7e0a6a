package main

import (
	"context"
	"encoding/json"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podRunner runs one pod: it prepares it, starts its program (again, after a crash), reports
// status, and tears everything down when stopped.
type podRunner struct {
	k      *kubelet
	key    string // namespace/name
	uid    types.UID
	dir    string // stateDir/pods/<uid>: volumes/, <container>.log, pid
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func newPodRunner(k *kubelet, pod *corev1.Pod) *podRunner {
	ctx, cancel := context.WithCancel(context.Background())
	return &podRunner{
		k:      k,
		key:    pod.Namespace + "/" + pod.Name,
		uid:    pod.UID,
		dir:    filepath.Join(k.cfg.stateDir, "pods", string(pod.UID)),
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
	}
}

// stop kills the pod's program and waits until its network and files are gone.
func (r *podRunner) stop() {
	r.cancel()
	<-r.done
}

// logPath is where a container's output is kept (served by logs.go).
func (r *podRunner) logPath(container string) string {
	return filepath.Join(r.dir, container+".log")
}

func (r *podRunner) run(pod *corev1.Pod) {
	defer close(r.done)
	defer os.RemoveAll(r.dir)
	c := pod.Spec.Containers[0]
	hostIP := r.k.cfg.nodeIP

	if why := unsupported(pod); why != "" {
		log.Printf("!!!!!!!! %s STAYS PENDING: %s !!!!!!!!", r.key, why)
		r.patchStatus(pod, waitingStatus(pod, "ImageNotMapped", "proc-kubelet: "+why))
		<-r.ctx.Done()
		return
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		log.Printf("%s: %v", r.key, err)
		return
	}
	ip, err := r.k.ips.take(r.key)
	if err != nil {
		log.Printf("!!!!!!!! %s STAYS PENDING: %v !!!!!!!!", r.key, err)
		<-r.ctx.Done()
		return
	}
	defer r.k.ips.release(ip)

	// Step 3: volumes and env. Referenced Secrets may appear later: retry, as a kubelet does.
	var env []string
	var args []string
	lastErr := ""
	err = retryEvery(r.ctx, 2*time.Second, func() error {
		mounts, err := writeVolumes(r.ctx, r.k.cs, pod, r.dir)
		if err == nil {
			env, err = resolveEnv(r.ctx, r.k.cs, pod, ip.String(), hostIP, mounts)
		}
		if err != nil {
			if err.Error() != lastErr {
				lastErr = err.Error()
				log.Printf("%s: waiting: %v", r.key, err)
				r.patchStatus(pod, waitingStatus(pod, "ContainerCreating", err.Error()))
			}
			return err
		}
		args = args[:0]
		for _, a := range c.Args {
			args = append(args, rewritePath(a, mounts))
		}
		return nil
	})
	if err != nil {
		return // stopped before the pod could start
	}
	if r.k.cfg.rigID != "" {
		env = append(env, "PROC_KUBELET_RIG="+r.k.cfg.rigID)
	}

	if classifyImage(c.Image) == imageFake {
		log.Printf("%s: image %s is faked: no process, marked Ready with IP %s", r.key, c.Image, ip)
		r.patchStatus(pod, runningStatus(pod, ip.String(), hostIP, time.Now(), 0, true))
		<-r.ctx.Done()
		return
	}
	if len(c.Command) > 0 {
		log.Printf("%s: container command %q is ignored: echo-basic runs instead", r.key, c.Command)
	}

	// Steps 4-6, and a restart (with backoff) whenever the program exits on its own.
	restarts := int32(0)
	for {
		started := time.Now()
		exited, err := r.start(c.Name, env, args, ip, pod.UID)
		if err != nil {
			log.Printf("!!!!!!!! %s: cannot start: %v", r.key, err)
		} else {
			code, gone := r.waitReady(pod, ip, started, restarts, exited)
			if !gone {
				select {
				case <-r.ctx.Done():
				case code = <-exited:
					gone = true
				}
			}
			if r.ctx.Err() != nil {
				// Stopped: wait until start's goroutine has killed the process and removed the veth.
				if !gone {
					<-exited
				}
				return
			}
			log.Printf("!!!!!!!! %s: container %s exited (%s); restarting", r.key, c.Name, code)
			r.patchStatus(pod, runningStatus(pod, ip.String(), hostIP, started, restarts, false))
		}
		restarts++
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(min(time.Duration(restarts)*time.Second, 10*time.Second)):
		}
	}
}

// start runs echo-basic in a new network namespace, attaches that namespace to the bridge, and
// returns a channel that gets the exit status. When the runner is stopped, the process is killed
// and the veth removed before the channel is written.
func (r *podRunner) start(container string, env, args []string, ip net.IP, uid types.UID) (<-chan string, error) {
	out, err := newLogWriter(r.logPath(container))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(r.k.cfg.echoBin, args...)
	cmd.Env = env
	cmd.Dir = r.dir
	cmd.Stdout = out.stream("stdout")
	cmd.Stderr = out.stream("stderr")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET, // its own network namespace (step 5)
		Setpgid:    true,
		Pdeathsig:  syscall.SIGKILL, // if proc-kubelet dies, its pods die with it
	}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	pid := cmd.Process.Pid
	_ = os.WriteFile(filepath.Join(r.dir, "pid"), []byte(strconv.Itoa(pid)+"\n"), 0o644)
	hostIf := vethName(string(uid))
	cfg := r.k.cfg
	if err := attachPod(pid, hostIf, cfg.bridge, ip, cfg.podCIDR, cfg.podGateway); err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
		out.Close()
		return nil, err
	}
	log.Printf("%s: started pid %d, IP %s, veth %s", r.key, pid, ip, hostIf)

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	exited := make(chan string, 1)
	go func() {
		var werr error
		select {
		case werr = <-waited:
		case <-r.ctx.Done():
			// Step 8: SIGTERM, then SIGKILL if it lingers.
			_ = syscall.Kill(-pid, syscall.SIGTERM)
			select {
			case werr = <-waited:
			case <-time.After(2 * time.Second):
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				werr = <-waited
			}
			log.Printf("%s: stopped pid %d", r.key, pid)
		}
		detachPod(hostIf)
		out.Close()
		_ = os.Remove(filepath.Join(r.dir, "pid"))
		status := "exit 0"
		if werr != nil {
			status = werr.Error()
		}
		exited <- status
	}()
	return exited, nil
}

// waitReady polls TCP podIP:readyPort and reports the pod Running and Ready when it answers
// (step 6). It gives up when the runner is stopped, or when the process exits: then it returns
// the exit status and gone=true.
func (r *podRunner) waitReady(pod *corev1.Pod, ip net.IP, started time.Time, restarts int32, exited <-chan string) (string, bool) {
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(r.k.cfg.readyPort))
	for {
		conn, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			conn.Close()
			log.Printf("%s: ready after %s (%s answers)", r.key, time.Since(started).Round(time.Millisecond), addr)
			r.patchStatus(pod, runningStatus(pod, ip.String(), r.k.cfg.nodeIP, started, restarts, true))
			return "", false
		}
		select {
		case <-r.ctx.Done():
			return "", false
		case code := <-exited:
			return code, true
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// patchStatus replaces the pod's status fields given (a JSON merge patch of the status
// subresource: lists are replaced whole, other fields are left alone).
func (r *podRunner) patchStatus(pod *corev1.Pod, status map[string]any) {
	body, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		log.Printf("%s: %v", r.key, err)
		return
	}
	err = retryEvery(r.ctx, time.Second, func() error {
		_, err := r.k.cs.CoreV1().Pods(pod.Namespace).Patch(r.ctx, pod.Name, types.MergePatchType, body,
			metav1.PatchOptions{}, "status")
		if err != nil && r.ctx.Err() == nil {
			log.Printf("%s: status: %v", r.key, err)
		}
		return err
	})
	_ = err // an error here means the runner was stopped
}

func condition(t corev1.PodConditionType, ok bool, now string) map[string]any {
	s := corev1.ConditionTrue
	if !ok {
		s = corev1.ConditionFalse
	}
	return map[string]any{"type": t, "status": s, "lastTransitionTime": now}
}

// runningStatus is the status of a started pod; ready says whether it answers.
func runningStatus(pod *corev1.Pod, podIP, hostIP string, started time.Time, restarts int32, ready bool) map[string]any {
	now := time.Now().UTC().Format(time.RFC3339)
	c := pod.Spec.Containers[0]
	state := map[string]any{"running": map[string]any{"startedAt": started.UTC().Format(time.RFC3339)}}
	if !ready {
		state = map[string]any{"waiting": map[string]any{"reason": "CrashLoopBackOff"}}
	}
	return map[string]any{
		"phase":     corev1.PodRunning,
		"podIP":     podIP,
		"podIPs":    []map[string]string{{"ip": podIP}},
		"hostIP":    hostIP,
		"hostIPs":   []map[string]string{{"ip": hostIP}},
		"startTime": pod.CreationTimestamp.UTC().Format(time.RFC3339),
		"conditions": []map[string]any{
			condition(corev1.PodReadyToStartContainers, true, now),
			condition(corev1.PodInitialized, true, now),
			condition(corev1.ContainersReady, ready, now),
			condition(corev1.PodReady, ready, now),
			condition(corev1.PodScheduled, true, now),
		},
		"containerStatuses": []map[string]any{{
			"name":         c.Name,
			"image":        c.Image,
			"imageID":      "proc://" + filepath.Base(c.Image),
			"containerID":  "proc://" + string(pod.UID) + "/" + c.Name,
			"ready":        ready,
			"started":      ready,
			"restartCount": restarts,
			"state":        state,
		}},
	}
}

// waitingStatus is the status of a pod that has not started (and may never).
func waitingStatus(pod *corev1.Pod, reason, message string) map[string]any {
	now := time.Now().UTC().Format(time.RFC3339)
	var statuses []map[string]any
	for _, c := range pod.Spec.Containers {
		statuses = append(statuses, map[string]any{
			"name": c.Name, "image": c.Image, "imageID": "", "ready": false, "restartCount": 0,
			"state": map[string]any{"waiting": map[string]any{"reason": reason, "message": message}},
		})
	}
	return map[string]any{
		"phase": corev1.PodPending,
		"conditions": []map[string]any{
			condition(corev1.PodScheduled, true, now),
			condition(corev1.ContainersReady, false, now),
			condition(corev1.PodReady, false, now),
		},
		"containerStatuses": statuses,
	}
}
