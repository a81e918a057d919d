package blocks

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// maxInFlight bounds the requests the handler serves at once, each with a
// MaxBlock buffer: 32 is 128 MiB.
const maxInFlight = 32

// blockTimeout bounds the time to receive or send one block (4 MiB in a
// minute is 70 kB/s).
const blockTimeout = time.Minute

// pathPrefix is where the handler serves blocks: PREFIX<id>.
const pathPrefix = "/blocks/"

type handler struct {
	store  Store
	signer *Signer
	slots  chan struct{}
	bufs   sync.Pool
}

// Handler serves store's blocks to other hosts: GET with a Range header
// reads (206), PUT writes a whole block (200 once Put returned, so the
// block is durable). Each request must carry a capability for its
// operation and block in CapabilityHeader, signed by signer; otherwise it
// gets 403. Delete and List are not served: only the server's collector
// runs them, on its own store.
func Handler(store Store, signer *Signer) http.Handler {
	h := &handler{store: store, signer: signer, slots: make(chan struct{}, maxInFlight)}
	h.bufs.New = func() any { b := make([]byte, MaxBlock); return &b }
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+pathPrefix+"{ino}/{unique}", h.get)
	mux.HandleFunc("PUT "+pathPrefix+"{ino}/{unique}", h.put)
	return mux
}

// NewHTTPServer returns a server for h that speaks HTTP/2 and HTTP/1.1
// over TLS with cert, with flow-control windows that let one stream send
// a whole block without waiting for window updates (net/http's are 1 MiB).
// Serve it with ServeTLS(ln, "", "").
func NewHTTPServer(h http.Handler, cert tls.Certificate) *http.Server {
	return &http.Server{
		Handler:           h,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerStream:     MaxBlock,
			MaxReceiveBufferPerConnection: 4 * MaxBlock,
			MaxReadFrameSize:              1 << 20,
		},
	}
}

// admit checks the request's id and capability, and takes a slot and its
// MaxBlock buffer, which the caller gives back with done.
func (h *handler) admit(w http.ResponseWriter, r *http.Request, op Op) (id ID, buf []byte, done func(), ok bool) {
	id, err := ParseID(r.PathValue("ino") + "/" + r.PathValue("unique"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return id, nil, nil, false
	}
	if err := h.signer.Check(r.Header.Get(CapabilityHeader), op, id); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return id, nil, nil, false
	}
	select {
	case h.slots <- struct{}{}:
	case <-r.Context().Done():
		return id, nil, nil, false
	}
	// a slot is held no longer than a block takes at a crawl, so that
	// stalled clients cannot take them all (net/http clears the
	// deadlines of a kept-alive connection for its next request)
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(blockTimeout))
	rc.SetWriteDeadline(time.Now().Add(blockTimeout))
	b := h.bufs.Get().(*[]byte)
	return id, *b, func() { h.bufs.Put(b); <-h.slots }, true
}

func (h *handler) get(w http.ResponseWriter, r *http.Request) {
	id, buf, done, ok := h.admit(w, r, OpRead)
	if !ok {
		return
	}
	defer done()
	off, n, ranged, err := parseRange(r.Header.Get("Range"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestedRangeNotSatisfiable)
		return
	}
	buf = buf[:n]
	got, err := h.store.ReadAt(r.Context(), id, buf, off)
	switch {
	case errors.Is(err, ErrNotFound):
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	case err != nil && err != io.EOF:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	case got == 0:
		http.Error(w, "blocks: range past the block's end", http.StatusRequestedRangeNotSatisfiable)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(got))
	w.Header().Set("Content-Type", "application/octet-stream")
	status := http.StatusOK
	if ranged {
		// the block's size is not known without another call: "*"
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/*", off, off+int64(got)-1))
		status = http.StatusPartialContent
	}
	w.WriteHeader(status)
	w.Write(buf[:got])
}

// parseRange reads a single "bytes=FIRST-LAST" range within a block; no
// header is the whole block.
func parseRange(s string) (off, n int64, ranged bool, err error) {
	if s == "" {
		return 0, MaxBlock, false, nil
	}
	spec, ok := strings.CutPrefix(s, "bytes=")
	first, last, ok2 := strings.Cut(spec, "-")
	if !ok || !ok2 {
		return 0, 0, false, fmt.Errorf("blocks: range %q: want bytes=FIRST-LAST", s)
	}
	a, err1 := strconv.ParseInt(first, 10, 64)
	b, err2 := strconv.ParseInt(last, 10, 64)
	if err1 != nil || err2 != nil || a < 0 || b < a || a >= MaxBlock {
		return 0, 0, false, fmt.Errorf("blocks: range %q: want bytes=FIRST-LAST within a block", s)
	}
	return a, min(b, MaxBlock-1) - a + 1, true, nil
}

func (h *handler) put(w http.ResponseWriter, r *http.Request) {
	id, buf, done, ok := h.admit(w, r, OpWrite)
	if !ok {
		return
	}
	defer done()
	switch {
	case r.ContentLength < 0:
		http.Error(w, "blocks: put without Content-Length", http.StatusLengthRequired)
		return
	case r.ContentLength > MaxBlock:
		http.Error(w, ErrTooBig.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	data := buf[:r.ContentLength]
	if _, err := io.ReadFull(r.Body, data); err != nil {
		http.Error(w, "blocks: body shorter than Content-Length", http.StatusBadRequest)
		return
	}
	if n, _ := r.Body.Read(make([]byte, 1)); n != 0 {
		http.Error(w, "blocks: body longer than Content-Length", http.StatusBadRequest)
		return
	}
	err := h.store.Put(r.Context(), id, data)
	switch {
	case err == nil:
		w.WriteHeader(http.StatusOK)
	case errors.Is(err, syscall.ENOSPC):
		http.Error(w, err.Error(), http.StatusInsufficientStorage)
	case errors.Is(err, ErrTooBig):
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
