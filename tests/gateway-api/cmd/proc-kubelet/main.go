// Command proc-kubelet is the process kubelet of sluice's Gateway API conformance rig
// (tests/gateway-api). It is not a kubelet: it runs no containers and pulls no images. It does
// just enough for the conformance suite's backend Pods:
//
//  1. registers one Ready Node (node.go);
//  2. binds every unscheduled Pod to it (there is no scheduler);
//  3. resolves each container's env and writes its Secret/ConfigMap volumes (spec.go);
//  4. maps the image to a local program: echo-basic images run the echo-basic binary built from
//     the pinned conformance module, coredns is faked (Ready, no process), anything else stays
//     Pending and is logged loudly (spec.go);
//  5. starts the program in a network namespace of its own, joined by a veth to the rig's bridge,
//     with an address from the pod range (network.go, pod.go);
//  6. marks the Pod Running and Ready once TCP podIP:3000 answers (pod.go);
//  7. keeps each container's output with timestamps and serves it at the kubelet's
//     /containerLogs endpoint, which the API server proxies for pods/log (logs.go);
//  8. on a deletionTimestamp, kills the program, removes the veth and deletes the Pod with grace
//     period 0 and a UID precondition (this file).
//
// It must run as root, in the rig's network namespace, next to a bridge that already has the pod
// gateway address (conformance.sh sets that up).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

// config holds the command-line flags.
type config struct {
	kubeconfig string
	nodeName   string
	nodeIP     string // the Node's InternalIP; the API server dials it for /containerLogs
	logAddr    string // where the /containerLogs server listens (must be nodeIP:kubeletPort)
	stateDir   string // per-pod directories: volumes, log files, pid files
	echoBin    string // the echo-basic binary that stands in for the echo-basic images
	bridge     string // the bridge the pods' veths join
	podCIDR    *net.IPNet
	podGateway net.IP // the bridge's address: the pods' default route
	readyPort  int    // a pod is Ready when TCP podIP:readyPort answers
	rigID      string // set as PROC_KUBELET_RIG in every pod process, so a cleanup can find them
}

func main() {
	log.SetFlags(log.Ldate | log.Ltime | log.Lmicroseconds)
	log.SetPrefix("proc-kubelet: ")
	cfg, err := parseFlags()
	if err != nil {
		log.Print(err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func parseFlags() (*config, error) {
	c := &config{}
	var cidr, gw string
	flag.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (required)")
	flag.StringVar(&c.nodeName, "node-name", "proc-node", "name of the Node to register")
	flag.StringVar(&c.nodeIP, "node-ip", "127.0.0.1", "the Node's InternalIP and the pods' hostIP")
	flag.StringVar(&c.logAddr, "listen", "127.0.0.1:10250", "HTTPS address of the /containerLogs server (the Node's kubelet endpoint)")
	flag.StringVar(&c.stateDir, "state-dir", "", "directory for per-pod files (required)")
	flag.StringVar(&c.echoBin, "echo-basic", "", "path of the echo-basic binary (required)")
	flag.StringVar(&c.bridge, "bridge", "br0", "bridge that the pods' veths are attached to")
	flag.StringVar(&cidr, "pod-cidr", "198.18.1.0/24", "range the pod addresses come from")
	flag.StringVar(&gw, "pod-gateway", "198.18.1.1", "the bridge's address, the pods' default route; never given to a pod")
	flag.IntVar(&c.readyPort, "ready-port", 3000, "a pod is Ready when TCP podIP:PORT answers")
	flag.StringVar(&c.rigID, "rig-id", "", "value of PROC_KUBELET_RIG in every pod process's environment")
	flag.Parse()
	if c.kubeconfig == "" || c.stateDir == "" || c.echoBin == "" {
		return nil, errors.New("--kubeconfig, --state-dir and --echo-basic are required")
	}
	var err error
	if _, c.podCIDR, err = net.ParseCIDR(cidr); err != nil || c.podCIDR.IP.To4() == nil {
		return nil, fmt.Errorf("--pod-cidr %q: an IPv4 CIDR is needed", cidr)
	}
	if c.podGateway = net.ParseIP(gw).To4(); c.podGateway == nil || !c.podCIDR.Contains(c.podGateway) {
		return nil, fmt.Errorf("--pod-gateway %q must be an IPv4 address inside --pod-cidr", gw)
	}
	if net.ParseIP(c.nodeIP) == nil {
		return nil, fmt.Errorf("--node-ip %q is not an IP address", c.nodeIP)
	}
	if _, err := os.Stat(c.echoBin); err != nil {
		return nil, fmt.Errorf("--echo-basic: %w", err)
	}
	return c, os.MkdirAll(c.stateDir, 0o755)
}

func run(cfg *config) error {
	rest, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		return err
	}
	rest.QPS, rest.Burst = 50, 100 // ~25 pods start at once; the default 5 QPS makes that slow
	rest.UserAgent = "proc-kubelet"
	cs, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if err := registerNode(ctx, cs, cfg); err != nil {
		return fmt.Errorf("registering node %s: %w", cfg.nodeName, err)
	}

	k := &kubelet{
		cfg:     cfg,
		cs:      cs,
		ips:     newIPPool(cfg.podCIDR, cfg.podGateway),
		runners: map[string]*podRunner{},
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
	}
	logSrv, err := serveLogs(cfg.logAddr, k)
	if err != nil {
		return err
	}
	defer logSrv.Close()

	// Every Pod is watched: the unscheduled ones (to bind them) and ours (to run them).
	factory := informers.NewSharedInformerFactory(cs, 0)
	podInformer := factory.Core().V1().Pods()
	k.lister = podInformer.Lister()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.Informer().HasSynced) {
		return errors.New("pod informer did not sync")
	}
	log.Printf("node %s ready; running pods with %s, logs on https://%s", cfg.nodeName, cfg.echoBin, cfg.logAddr)

	var workers sync.WaitGroup
	for range 4 {
		workers.Go(func() {
			for k.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	k.queue.ShutDown()
	workers.Wait()
	factory.Shutdown()

	// Stop every pod process; the Pod objects are left as they are (the API server goes too).
	k.mu.Lock()
	runners := k.runners
	k.runners = map[string]*podRunner{}
	k.mu.Unlock()
	for _, r := range runners {
		r.stop()
	}
	log.Printf("stopped %d pod(s); exiting", len(runners))
	return nil
}

// kubelet holds the pods this process runs, by "namespace/name".
type kubelet struct {
	cfg    *config
	cs     kubernetes.Interface
	lister corelisters.PodLister
	queue  workqueue.TypedRateLimitingInterface[string]
	ips    *ipPool

	mu      sync.Mutex
	runners map[string]*podRunner
}

func (k *kubelet) processNext(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		log.Printf("%s: %v (will retry)", key, err)
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

// runner returns the runner of a pod key, if any.
func (k *kubelet) runner(key string) *podRunner {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.runners[key]
}

func (k *kubelet) setRunner(key string, r *podRunner) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if r == nil {
		delete(k.runners, key)
	} else {
		k.runners[key] = r
	}
}

// sync brings one pod key to its wanted state. The work queue never hands the same key to two
// workers at once, so a key's runner is only started and stopped here.
func (k *kubelet) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := k.lister.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		pod = nil
	} else if err != nil {
		return err
	}

	// A runner for an object that is gone, or for an older pod of the same name.
	if r := k.runner(key); r != nil && (pod == nil || pod.UID != r.uid) {
		r.stop()
		k.setRunner(key, nil)
	}
	if pod == nil {
		return nil
	}

	switch {
	case pod.Spec.NodeName == "":
		if pod.DeletionTimestamp != nil {
			return nil // the API server removes an unbound pod by itself
		}
		return k.bind(ctx, pod)
	case pod.Spec.NodeName != k.cfg.nodeName:
		return nil // not ours
	case pod.DeletionTimestamp != nil:
		// Step 8: kill the program and drop its network, then remove the object for good.
		if r := k.runner(key); r != nil {
			r.stop()
			k.setRunner(key, nil)
		}
		return k.finalDelete(ctx, pod)
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return nil
	}
	if k.runner(key) == nil {
		r := newPodRunner(k, pod)
		k.setRunner(key, r)
		go r.run(pod.DeepCopy())
	}
	return nil
}

// bind is the scheduler's job: POST pods/binding to our node.
func (k *kubelet) bind(ctx context.Context, pod *corev1.Pod) error {
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: k.cfg.nodeName},
	}
	err := k.cs.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // bound meanwhile, or gone; the next event says which
	}
	if err == nil {
		log.Printf("%s/%s: bound to %s", pod.Namespace, pod.Name, k.cfg.nodeName)
	}
	return err
}

// finalDelete removes a terminating pod at once, but only the pod with this UID (a new pod of
// the same name is left alone).
func (k *kubelet) finalDelete(ctx context.Context, pod *corev1.Pod) error {
	zero := int64(0)
	uid := pod.UID
	err := k.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	if err == nil {
		log.Printf("%s/%s: deleted", pod.Namespace, pod.Name)
	}
	return err
}

// retryEvery calls f until it succeeds or ctx ends.
func retryEvery(ctx context.Context, d time.Duration, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(d):
		}
	}
}
