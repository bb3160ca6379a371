module toolstackd

go 1.26.8

require (
	github.com/google/btree v1.1.3
	github.com/google/uuid v1.6.0
)

require (
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/gorilla/mux v1.8.1 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	golang.org/x/sys v0.45.0 // indirect
)
