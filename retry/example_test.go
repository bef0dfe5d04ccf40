package retry_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/egret-proxy/egret/retry"
)

// A GET that meets a 503 is retried; a POST that meets one is relayed and
// marked ambiguous, because the server may have run it.
func ExampleTransport() {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1)%2 == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "done")
	}))
	defer srv.Close()

	client := &http.Client{Transport: &retry.Transport{}}
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	tr, _ := retry.TraceOf(resp)
	fmt.Println(resp.StatusCode, string(body), len(tr.Attempts), "attempts")

	resp, err = client.Post(srv.URL, "text/plain", nil)
	if errors.Is(err, retry.ErrAmbiguous) {
		fmt.Println("ambiguous")
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Header.Get(retry.HeaderOutcome))
	// Output:
	// 200 done 2 attempts
	// 503 ambiguous
}
