package transport

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"fmt"
	"math/big"
	"time"

	"github.com/leasefs/leasefs/internal/ids"
)

// ClientKey is what a client proves on every connection besides the
// token: a key pair, presented as a TLS client certificate, whose public
// key names the client (ID). Client ids are chosen by nobody: a
// connection can claim only the id of the key it holds, so one token
// holder cannot take over another's id (its callbacks, its session)
// however it learnt it, and a client that reconnects, from another
// address too, proves the same id with the same key.
//
// A server presents the cluster's Identity as its key instead (PeerKey):
// a connection that proves it holds the cluster's private key may claim
// any id, which is how servers call each other under their peer ids.
type ClientKey struct {
	cert tls.Certificate
	id   ids.ClientID
}

// NewClientKey makes a fresh key, one per client process.
func NewClientKey() (*ClientKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("transport: client key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "leasefs client"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(100, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return nil, fmt.Errorf("transport: client certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("transport: client certificate: %w", err)
	}
	return &ClientKey{
		cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: priv, Leaf: leaf},
		id:   clientIDOf(leaf),
	}, nil
}

// PeerKey is the key a server of the cluster presents when it calls
// another: the cluster's certificate and private key, claiming id.
func (id *Identity) PeerKey(as ids.ClientID) *ClientKey {
	return &ClientKey{cert: id.Cert, id: as}
}

// ID is the client id the key proves.
func (k *ClientKey) ID() ids.ClientID { return k.id }

// clientIDOf derives a client id from a certificate's public key: 63 bits
// of its hash, never 0 ("no client") and never with the top bit set, the
// range where the cluster's peer ids live.
func clientIDOf(cert *x509.Certificate) ids.ClientID {
	h := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	id := binary.LittleEndian.Uint64(h[:8]) >> 1
	if id == 0 {
		id = 1
	}
	return ids.ClientID(id)
}
