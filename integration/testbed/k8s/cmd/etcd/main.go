// Command etcd is the etcd server at the exact version k8s.io/kubernetes pins,
// so the test bed's storage matches what the release was tested with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
