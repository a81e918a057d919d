// Package transport carries leasefs requests, replies and server-to-client
// callbacks over QUIC (quic-go).
//
// A server has an Identity: a self-signed certificate and a shared secret. A
// client holds a Token: the certificate's hash, which it pins instead of
// trusting a CA, and the secret, which it proves on the first stream of every
// connection (HMAC-SHA256 of TLS exporter material, so a proof cannot be
// replayed on another connection). The server serves nothing on a connection
// before that proof checks out. A client also presents a key of its own as
// a TLS client certificate (ClientKey): its client id is derived from that
// key, so a connection can claim no other client's id, and only the holder
// gets a client's callbacks. Servers present the cluster's own key, which
// lets them claim their peer ids.
//
// Every request carries a Header (client, session, seq). The server keeps a
// reply cache per session the application opened (OpenSession): a request
// whose seq it has seen gets the first execution's reply, waiting for it if
// that execution is still running. Client.Call resends the same header after
// a lost connection, so the application handler runs at most once per
// (client, session, seq).
//
// # Caller duties
//
//   - Seq must be unique within a session and should increase: a seq older than
//     the reply cache's window that the server no longer remembers is refused
//     with ErrReplyEvicted rather than executed a second time.
//   - A server application opens each session with Server.OpenSession before
//     its client learns of it, and forgets it with ForgetSession; requests in
//     other sessions run without a reply cache, for the application to refuse.
//   - A client that sets ClientConfig.Oldest counts a seq from the moment it
//     chooses it until it is done with it, resends included.
//   - Handler and ClientConfig.Callback are called concurrently and own the
//     body they are given and the body they return.
//   - Any reply of the handler is an application reply (an ACK in the lease
//     sense); transport-level errors never are.
//
// # Bounds
//
// What a peer can make a server hold is bounded (ServerConfig): connections
// waiting for their hello (and the hello's size), connections in all and
// per client, streams per connection, request bodies being received or
// handled (reserved whole, read as they come), reply bytes per session and
// in all, callback replies.
//
// # Timing
//
// Connections send keep-alives every 2 s and die after 10 s without traffic.
// A restarted server (same Identity) answers packets of old connections with a
// stateless reset, so clients notice at once and redial.
package transport

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/leasefs/leasefs/internal/ids"
)

// Header identifies a request for the reply cache.
type Header struct {
	Client  ids.ClientID
	Session ids.SessionID
	Seq     uint64
}

func (h Header) String() string {
	return fmt.Sprintf("%v/%v/seq:%d", h.Client, h.Session, h.Seq)
}

var (
	ErrAuth         = errors.New("transport: server refused our token")
	ErrWrongServer  = errors.New("transport: server certificate does not match token")
	ErrUnreachable  = errors.New("transport: server unreachable")
	ErrClosed       = errors.New("transport: closed")
	ErrTooLarge     = errors.New("transport: message too large")
	ErrNotConnected = errors.New("transport: client not connected")
	ErrProtocol     = errors.New("transport: protocol error")
	// ErrReplyEvicted: the server no longer holds the reply to this seq, so it
	// refused to execute the request again (at most once).
	ErrReplyEvicted = errors.New("transport: reply no longer cached")
	// ErrBusy: the server had no room for the request or the connection
	// within its bounds; Client.Call sends it again after a while.
	ErrBusy = errors.New("transport: server busy")

	errServerShutdown = errors.New("transport: server shutting down")
)

const alpn = "leasefs/1"

// Application close codes on a QUIC connection.
const (
	closeNormal  quic.ApplicationErrorCode = 0
	closeRefused quic.ApplicationErrorCode = 1
	closeProto   quic.ApplicationErrorCode = 2
)

// Stream cancel codes.
const streamCancel quic.StreamErrorCode = 1

const (
	keepAlive   = 2 * time.Second
	idleTimeout = 10 * time.Second
	// authTimeout bounds how long a server waits for the hello on a new
	// connection; it is also the client's default dial timeout.
	authTimeout = 5 * time.Second
	// maxStreams bounds concurrent requests per connection; a client's stream
	// pool never holds more, and OpenStreamSync waits beyond it (back-pressure).
	maxStreams         = 256
	maxCallbackStreams = 64
)

func quicConfig(incoming int64) *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout:           authTimeout,
		MaxIdleTimeout:                 idleTimeout,
		KeepAlivePeriod:                keepAlive,
		MaxIncomingStreams:             incoming,
		MaxIncomingUniStreams:          -1,
		InitialStreamReceiveWindow:     1 << 20,
		MaxStreamReceiveWindow:         16 << 20,
		InitialConnectionReceiveWindow: 4 << 20,
		MaxConnectionReceiveWindow:     64 << 20,
		EnableDatagrams:                true,
	}
}

// statelessResetKey derives the key from the identity secret so that a
// restarted server resets its predecessor's connections (RFC 9000 10.3) and
// clients redial at once instead of waiting for the idle timeout.
func statelessResetKey(secret [32]byte) *quic.StatelessResetKey {
	var k quic.StatelessResetKey
	b, err := hkdf.Key(sha256.New, secret[:], nil, "leasefs stateless reset key", len(k))
	if err != nil {
		panic("transport: hkdf: " + err.Error())
	}
	copy(k[:], b)
	return &k
}

const exporterLabel = "EXPORTER-leasefs-auth"

// authProof binds the secret to this TLS connection: exporter material is
// unique per connection, so a captured proof is useless elsewhere.
func authProof(secret [32]byte, cs tls.ConnectionState) ([32]byte, error) {
	var p [32]byte
	ekm, err := cs.ExportKeyingMaterial(exporterLabel, nil, 32)
	if err != nil {
		return p, fmt.Errorf("transport: tls exporter: %w", err)
	}
	m := hmac.New(sha256.New, secret[:])
	m.Write(ekm)
	copy(p[:], m.Sum(nil))
	return p, nil
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
