// The local cluster's NetworkPolicy enforcer: sigs.k8s.io/kube-network-policies'
// pkg/networkpolicy (every packet verdict, its nfqueue handling) with a command line for a
// cluster on a shared host (cluster/localkube/netpol.py). Upstream's cmd/main.go (v0.8.0) reads
// only the in-cluster config (a ServiceAccount token at a fixed path) and uses one fixed
// nftables table; this one takes a kubeconfig and a table name. localkube queues the packets
// with an iptables rule of its own and passes a node name that no Node has
// (localkube.netpol.NO_NODE), so upstream's nftables table, which the kernels of this
// project's machines cannot hold (no nftables `queue` expression), selects no pod and is
// written once at start (where it fails, one log line) and never again. Built by
// cluster/build.sh (`netpol`) in a wrapper module that requires kube-network-policies and
// nothing else, so upstream's own pins win.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster's API server")
	node := flag.String("hostname-override", "", "the Node whose pods go in the nftables set")
	queue := flag.Int("nfqueue-id", 100, "nfqueue number (one per cluster on the host)")
	table := flag.String("nftables-table", "kube-network-policies", "nftables table (inet family)")
	klog.InitFlags(nil)
	flag.Parse()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	// NRI stays on, as upstream's default: v0.8.0 with NRIdisabled has no NRI plugin and
	// dereferences it (nil) for the first packet from an address no pod has (the host's).
	// This cluster has no NRI runtime, and the enforcer must not register with the host's
	// (/var/run/nri/nri.sock): a socket that is no file descriptor makes the plugin's
	// connect fail at once (one log line, "nri plugin exited"), and it looks pods up in the
	// API alone.
	os.Setenv("NRI_PLUGIN_SOCKET", "none: the local cluster has no NRI runtime")
	factory := informers.NewSharedInformerFactory(client, 0)
	ctrl, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(), factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(), nil, nil, nil, nil,
		networkpolicy.Config{QueueID: *queue, NodeName: *node, NFTableName: *table,
			NetfilterBug1766Fix: true})
	if err != nil {
		klog.Fatalf("controller: %v", err)
	}
	factory.Start(ctx.Done())
	// Run binds the queue once the informers have synced and removes its table when ctx
	// ends; an error here (nfqueue) is fatal.
	if err := ctrl.Run(ctx); err != nil {
		klog.Fatalf("enforcer: %v", err)
	}
}
