package main

import (
	"context"
	"log"
	"net"
	"runtime"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// kubeletPort is the port the API server dials for /containerLogs (the Node's
// status.daemonEndpoints.kubeletEndpoint.port).
func kubeletPort(cfg *config) int32 {
	_, port, _ := net.SplitHostPort(cfg.logAddr)
	n, _ := strconv.ParseInt(port, 10, 32)
	return int32(n)
}

// registerNode creates (or takes over) the Node and marks it Ready. The EndpointSlice controller
// skips pods whose Node does not exist, so this comes before any pod is run.
func registerNode(ctx context.Context, cs kubernetes.Interface, cfg *config) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: cfg.nodeName,
			Labels: map[string]string{
				"kubernetes.io/hostname": cfg.nodeName,
				"kubernetes.io/os":       runtime.GOOS,
				"kubernetes.io/arch":     runtime.GOARCH,
			},
		},
	}
	return retryEvery(ctx, time.Second, func() error {
		_, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			log.Printf("creating node: %v", err)
			return err
		}
		current, err := cs.CoreV1().Nodes().Get(ctx, cfg.nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		current.Status = nodeStatus(cfg)
		if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, current, metav1.UpdateOptions{}); err != nil {
			log.Printf("node status: %v", err)
			return err
		}
		return nil
	})
}

func nodeStatus(cfg *config) corev1.NodeStatus {
	now := metav1.Now()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods:   *resource.NewQuantity(250, resource.DecimalSI),
	}
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady"),
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID"),
		},
		// Only an InternalIP: with a Hostname address the API server would dial "proc-node:10250".
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: cfg.nodeIP}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: kubeletPort(cfg)}},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion:          "v0.0.0-proc-kubelet",
			OperatingSystem:         runtime.GOOS,
			Architecture:            runtime.GOARCH,
			ContainerRuntimeVersion: "proc://0",
		},
	}
}
