package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// benchSpec is what the bench child measures from inside a pod.
type benchSpec struct {
	Addr     string        `json:"addr"` // host:port of the upstream
	Connects int           `json:"connects"`
	Duration time.Duration `json:"duration"`
	Conc     int           `json:"conc"`
}

type benchResult struct {
	ConnectP50  time.Duration `json:"connect_p50"`
	ConnectP99  time.Duration `json:"connect_p99"`
	ConnectMean time.Duration `json:"connect_mean"`
	KeepAlive   float64       `json:"keepalive_rps"`
	NewConn     float64       `json:"newconn_rps"`
	Errors      int64         `json:"errors"`
}

func benchChild() int {
	var s benchSpec
	if err := json.Unmarshal([]byte(os.Getenv("EGRET_E2E_REQ")), &s); err != nil {
		return 2
	}
	var res benchResult
	// connect(): a blocking connect and close, one at a time.
	lat := make([]time.Duration, 0, s.Connects)
	var sum time.Duration
	for range s.Connects {
		t0 := time.Now()
		c, err := net.Dial("tcp", s.Addr)
		d := time.Since(t0)
		if err != nil {
			res.Errors++
			continue
		}
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		lat = append(lat, d)
		sum += d
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		res.ConnectP50 = lat[len(lat)/2]
		res.ConnectP99 = lat[len(lat)*99/100]
		res.ConnectMean = sum / time.Duration(len(lat))
	}
	run := func(keepAlive bool) float64 {
		var n, errs atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), s.Duration)
		defer cancel()
		var wg sync.WaitGroup
		for range s.Conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tr := &http.Transport{DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 1}
				defer tr.CloseIdleConnections()
				c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
				for ctx.Err() == nil {
					resp, err := c.Get("http://" + s.Addr + "/")
					if err != nil {
						errs.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						n.Add(1)
					} else {
						errs.Add(1)
					}
				}
			}()
		}
		start := time.Now()
		wg.Wait()
		res.Errors += errs.Load()
		return float64(n.Load()) / time.Since(start).Seconds()
	}
	res.KeepAlive = run(true)
	res.NewConn = run(false)
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}
