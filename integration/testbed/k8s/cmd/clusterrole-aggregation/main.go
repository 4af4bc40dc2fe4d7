// Command clusterrole-aggregation runs kube-controller-manager's
// clusterrole-aggregation controller, unchanged, on its own: it fills the
// rules of ClusterRoles with an aggregationRule (admin, edit, view) from the
// ClusterRoles their selectors match. The test bed has no
// kube-controller-manager; this is the one controller RBAC tests need.
//
// Usage: clusterrole-aggregation --kubeconfig FILE
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/kubernetes/pkg/controller/clusterroleaggregation"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of a user allowed to read and update ClusterRoles")
	flag.Parse()
	if err := run(*kubeconfig); err != nil {
		fmt.Fprintln(os.Stderr, "clusterrole-aggregation:", err)
		os.Exit(1)
	}
}

func run(kubeconfig string) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	factory := informers.NewSharedInformerFactory(client, 12*time.Hour)
	controller := clusterroleaggregation.NewClusterRoleAggregation(
		factory.Rbac().V1().ClusterRoles(),
		client.RbacV1(),
	)
	factory.Start(ctx.Done())
	controller.Run(ctx, 5)
	return nil
}
