package impure

import (
	"math/rand"
	"os"
	"time"
)

func bad() {
	_ = time.Now()
	go func() {}()
	var c chan int
	_ = c
	_ = rand.Intn(3)
	_ = os.Getpid()
}
