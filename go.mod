module toolstackd

go 1.26.8

require (
	github.com/google/btree v1.1.3
	github.com/google/uuid v1.6.0
)
