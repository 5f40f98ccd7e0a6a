package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// imageKind says what stands in for an image.
type imageKind int

const (
	imageUnknown imageKind = iota // not run: the pod stays Pending
	imageEcho                     // run the echo-basic binary
	imageFake                     // no process; the pod is simply marked Ready
)

// classifyImage maps an image reference to what the rig runs for it, by repository name, any
// tag or digest: ".../echo-basic" (the conformance echo server; its source is a superset of
// every tag the suite uses) and ".../coredns" (only the UDP tests talk to it).
func classifyImage(image string) imageKind {
	repo := image
	if i := strings.Index(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	switch repo[strings.LastIndex(repo, "/")+1:] {
	case "echo-basic":
		return imageEcho
	case "coredns":
		return imageFake
	}
	return imageUnknown
}

// unsupported says why a pod cannot be run here, or "" if it can: exactly one container, no
// init containers, and a mapped image.
func unsupported(pod *corev1.Pod) string {
	switch {
	case len(pod.Spec.InitContainers) > 0:
		return "init containers are not supported"
	case len(pod.Spec.Containers) != 1:
		return fmt.Sprintf("%d containers; only single-container pods are supported", len(pod.Spec.Containers))
	case classifyImage(pod.Spec.Containers[0].Image) == imageUnknown:
		return fmt.Sprintf("image %q is not mapped to a program (only .../echo-basic:* runs; .../coredns:* is faked)",
			pod.Spec.Containers[0].Image)
	}
	return ""
}

// writeVolumes materialises the pod's Secret, ConfigMap and emptyDir volumes under dir/volumes
// and returns mountPath -> local directory for the container's mounts. Projected volumes (the
// ServiceAccount token that admission adds to every pod) are not written: nothing the rig runs
// reads them. A missing Secret or ConfigMap that is not optional is an error; the caller retries,
// as a kubelet does (the suite creates some Secrets after the Deployments that mount them).
func writeVolumes(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, dir string) (map[string]string, error) {
	local := map[string]string{} // volume name -> directory
	for _, v := range pod.Spec.Volumes {
		vdir := filepath.Join(dir, "volumes", v.Name)
		var files map[string][]byte
		var items []corev1.KeyToPath
		mode := int32(0o644)
		switch {
		case v.Secret != nil:
			s, err := cs.CoreV1().Secrets(pod.Namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				if isOptional(v.Secret.Optional) {
					files = nil
					break
				}
				return nil, fmt.Errorf("volume %s: secret %s: %w", v.Name, v.Secret.SecretName, err)
			}
			files, items = s.Data, v.Secret.Items
			if v.Secret.DefaultMode != nil {
				mode = *v.Secret.DefaultMode
			}
		case v.ConfigMap != nil:
			cm, err := cs.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				if isOptional(v.ConfigMap.Optional) {
					break
				}
				return nil, fmt.Errorf("volume %s: configmap %s: %w", v.Name, v.ConfigMap.Name, err)
			}
			files = map[string][]byte{}
			for k, s := range cm.Data {
				files[k] = []byte(s)
			}
			for k, b := range cm.BinaryData {
				files[k] = b
			}
			items = v.ConfigMap.Items
			if v.ConfigMap.DefaultMode != nil {
				mode = *v.ConfigMap.DefaultMode
			}
		case v.EmptyDir != nil:
		default:
			continue // projected, hostPath, PVC, ...: not materialised
		}
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return nil, err
		}
		if err := writeKeys(vdir, files, items, mode); err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		local[v.Name] = vdir
	}

	mounts := map[string]string{} // mountPath -> directory (or file, with subPath)
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if d, ok := local[m.Name]; ok {
			mounts[filepath.Clean(m.MountPath)] = filepath.Join(d, m.SubPath)
		}
	}
	return mounts, nil
}

// writeKeys writes every key (or only the listed items, at their paths) into dir.
func writeKeys(dir string, data map[string][]byte, items []corev1.KeyToPath, mode int32) error {
	type file struct {
		path string
		mode int32
	}
	want := map[string]file{}
	if len(items) == 0 {
		for k := range data {
			want[k] = file{k, mode}
		}
	}
	for _, it := range items {
		if _, ok := data[it.Key]; !ok {
			return fmt.Errorf("key %q not found", it.Key)
		}
		m := mode
		if it.Mode != nil {
			m = *it.Mode
		}
		want[it.Key] = file{it.Path, m}
	}
	for k, f := range want {
		p := filepath.Join(dir, filepath.Clean("/"+f.path)) // no escaping dir with ".."
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data[k], os.FileMode(f.mode)&0o777); err != nil {
			return err
		}
	}
	return nil
}

func isOptional(b *bool) bool { return b != nil && *b }

// rewritePath points a value that names a file under a volume's mountPath at the local copy.
// The longest matching mountPath wins.
func rewritePath(v string, mounts map[string]string) string {
	paths := make([]string, 0, len(mounts))
	for mp := range mounts {
		paths = append(paths, mp)
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for _, mp := range paths {
		if v == mp || strings.HasPrefix(v, mp+"/") || mp == "/" && strings.HasPrefix(v, "/") {
			return filepath.Join(mounts[mp], strings.TrimPrefix(v, mp))
		}
	}
	return v
}

// resolveEnv builds the container's environment from env (values, fieldRefs, Secret and
// ConfigMap keys), then points values that name files under a volume's mountPath at the local
// copy. Not done (echo-basic needs none of it): envFrom, $(VAR) expansion, service links, the
// KUBERNETES_* variables.
func resolveEnv(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, podIP, hostIP string, mounts map[string]string) ([]string, error) {
	c := &pod.Spec.Containers[0]
	if len(c.EnvFrom) > 0 {
		return nil, fmt.Errorf("envFrom is not supported")
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + pod.Name}
	for _, e := range c.Env {
		v, ok := e.Value, true
		if e.ValueFrom != nil {
			var err error
			if v, ok, err = valueFrom(ctx, cs, pod, e.ValueFrom, podIP, hostIP); err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
		}
		if ok {
			env = append(env, e.Name+"="+rewritePath(v, mounts)) // a later duplicate wins, as in Kubernetes
		}
	}
	return env, nil
}

// valueFrom resolves one env valueFrom. ok is false for an optional key that is absent.
func valueFrom(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, src *corev1.EnvVarSource, podIP, hostIP string) (string, bool, error) {
	switch {
	case src.FieldRef != nil:
		switch p := src.FieldRef.FieldPath; p {
		case "metadata.name":
			return pod.Name, true, nil
		case "metadata.namespace":
			return pod.Namespace, true, nil
		case "metadata.uid":
			return string(pod.UID), true, nil
		case "spec.nodeName":
			return pod.Spec.NodeName, true, nil
		case "spec.serviceAccountName":
			return pod.Spec.ServiceAccountName, true, nil
		case "status.podIP", "status.podIPs":
			return podIP, true, nil
		case "status.hostIP", "status.hostIPs":
			return hostIP, true, nil
		default:
			return "", false, fmt.Errorf("fieldRef %q is not supported", p)
		}
	case src.SecretKeyRef != nil:
		ref := src.SecretKeyRef
		s, err := cs.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, err
		}
		b, ok := s.Data[ref.Key]
		if !ok && !isOptional(ref.Optional) {
			return "", false, fmt.Errorf("secret %s has no key %q", ref.Name, ref.Key)
		}
		return string(b), ok, nil
	case src.ConfigMapKeyRef != nil:
		ref := src.ConfigMapKeyRef
		cm, err := cs.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if isOptional(ref.Optional) {
				return "", false, nil
			}
			return "", false, err
		}
		v, ok := cm.Data[ref.Key]
		if !ok && !isOptional(ref.Optional) {
			return "", false, fmt.Errorf("configmap %s has no key %q", ref.Name, ref.Key)
		}
		return v, ok, nil
	}
	return "", false, fmt.Errorf("this kind of valueFrom is not supported")
}
