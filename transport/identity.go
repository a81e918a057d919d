package transport

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Identity is a cluster's TLS identity (a self-signed ECDSA P-256 certificate)
// and the shared secret clients prove they know.
type Identity struct {
	Cert   tls.Certificate
	Secret [32]byte
}

// Token is what a client needs to reach a cluster: the hash of the server
// certificate it pins and the shared secret.
type Token struct {
	CertHash [32]byte
	Secret   [32]byte
}

const (
	identityFile     = "identity"
	tokenFile        = "token"
	adminTokenFile   = "admin-token"
	tokenPrefix      = "lfs1-"
	adminTokenPrefix = "lfsadmin1-"
	pemSecretType    = "LEASEFS SECRET"
)

// LoadOrCreateIdentity loads DIR/identity (certificate, key and secret, mode
// 0600) or creates it when missing, and (re)writes DIR/token and
// DIR/admin-token (mode 0600).
// created reports whether a new identity was made.
func LoadOrCreateIdentity(dir string) (id *Identity, created bool, err error) {
	path := filepath.Join(dir, identityFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		id, err = parseIdentity(data)
		if err != nil {
			return nil, false, fmt.Errorf("transport: identity %s: %w", path, err)
		}
	case errors.Is(err, fs.ErrNotExist):
		id, data, err = newIdentity()
		if err != nil {
			return nil, false, err
		}
		if err := writeFileAtomic(path, data); err != nil {
			return nil, false, fmt.Errorf("transport: write identity: %w", err)
		}
		created = true
	default:
		return nil, false, fmt.Errorf("transport: read identity: %w", err)
	}
	if err := writeTokens(dir, id); err != nil {
		return nil, false, err
	}
	return id, created, nil
}

// NewIdentity makes a fresh identity in memory (tests, embedded servers that
// keep nothing).
func NewIdentity() (*Identity, error) {
	id, _, err := newIdentity()
	return id, err
}

func newIdentity() (*Identity, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: generate key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("transport: serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "leasefs"},
		DNSNames:     []string{"leasefs"},
		NotBefore:    time.Now().Add(-time.Hour),
		// clients pin the certificate by hash, so expiry would only break clusters
		NotAfter:    time.Now().AddDate(100, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: create certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("transport: marshal key: %w", err)
	}
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, nil, fmt.Errorf("transport: secret: %w", err)
	}
	buf := identityPEM(der, keyDER, secret)
	id, err := parseIdentity(buf)
	return id, buf, err
}

func identityPEM(certDER, keyDER []byte, secret [32]byte) []byte {
	var buf []byte
	buf = append(buf, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER})...)
	buf = append(buf, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})...)
	buf = append(buf, pem.EncodeToMemory(&pem.Block{Type: pemSecretType, Bytes: secret[:]})...)
	return buf
}

// PEM encodes the identity as DIR/identity holds it (certificate, key and
// secret), for copying a cluster's identity to another server.
func (id *Identity) PEM() ([]byte, error) {
	keyDER, err := x509.MarshalPKCS8PrivateKey(id.Cert.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("transport: marshal key: %w", err)
	}
	return identityPEM(id.Cert.Certificate[0], keyDER, id.Secret), nil
}

// ParseIdentity reads what Identity.PEM wrote.
func ParseIdentity(data []byte) (*Identity, error) {
	id, err := parseIdentity(data)
	if err != nil {
		return nil, fmt.Errorf("transport: identity: %w", err)
	}
	return id, nil
}

// SaveIdentity writes id to DIR/identity and its tokens to DIR/token and
// DIR/admin-token (all 0600), replacing what is there: how a server joins a cluster whose
// identity it was given.
func SaveIdentity(dir string, id *Identity) error {
	data, err := id.PEM()
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, identityFile), data); err != nil {
		return fmt.Errorf("transport: write identity: %w", err)
	}
	return writeTokens(dir, id)
}

// writeTokens writes DIR/token and DIR/admin-token (both 0600).
func writeTokens(dir string, id *Identity) error {
	if err := writeIfChanged(filepath.Join(dir, tokenFile), []byte(id.Token()+"\n")); err != nil {
		return fmt.Errorf("transport: write token: %w", err)
	}
	if err := writeIfChanged(filepath.Join(dir, adminTokenFile), []byte(id.TokenValue().Admin().String()+"\n")); err != nil {
		return fmt.Errorf("transport: write admin token: %w", err)
	}
	return nil
}

// writeIfChanged writes data to path (writeFileAtomic) unless path holds
// it already: a restart writes nothing, and so starts on a full disk.
func writeIfChanged(path string, data []byte) error {
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, data) {
		return nil
	}
	return writeFileAtomic(path, data)
}

func parseIdentity(data []byte) (*Identity, error) {
	var certPEM, keyPEM []byte
	var secret []byte
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		switch b.Type {
		case "CERTIFICATE":
			certPEM = pem.EncodeToMemory(b)
		case "PRIVATE KEY", "EC PRIVATE KEY":
			keyPEM = pem.EncodeToMemory(b)
		case pemSecretType:
			secret = b.Bytes
		}
	}
	if certPEM == nil || keyPEM == nil || len(secret) != 32 {
		return nil, errors.New("needs a CERTIFICATE, a PRIVATE KEY and a 32-byte " + pemSecretType + " block")
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	id := &Identity{Cert: cert}
	copy(id.Secret[:], secret)
	return id, nil
}

// writeFileAtomic writes via a temporary file and rename so a crash never
// leaves a half-written identity behind.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp) // (a full disk: nothing half-written stays)
	}
	return err
}

// CertHash is the SHA-256 of the certificate's DER encoding, which clients pin.
func (id *Identity) CertHash() [32]byte {
	return sha256.Sum256(id.Cert.Certificate[0])
}

// TokenValue returns the identity's token as a value.
func (id *Identity) TokenValue() Token {
	return Token{CertHash: id.CertHash(), Secret: id.Secret}
}

// Token returns "lfs1-" + hex(sha256(cert DER)) + "-" + hex(secret).
func (id *Identity) Token() string { return id.TokenValue().String() }

// String formats the token as ParseToken reads it. It contains the secret.
func (t Token) String() string {
	return tokenPrefix + hex.EncodeToString(t.CertHash[:]) + "-" + hex.EncodeToString(t.Secret[:])
}

// ParseToken parses a token written by Identity.Token.
func ParseToken(s string) (Token, error) {
	var t Token
	s = strings.TrimSpace(s)
	if s == "" {
		return t, errors.New("transport: token: empty")
	}
	rest, ok := strings.CutPrefix(s, tokenPrefix)
	if !ok {
		return t, errors.New(`transport: token: does not start with "lfs1-" (not a leasefs token, or from another version)`)
	}
	hashHex, secretHex, ok := strings.Cut(rest, "-")
	if !ok || len(hashHex) != 64 || len(secretHex) != 64 {
		return t, errors.New("transport: token: wrong length (want lfs1-<64 hex digits>-<64 hex digits>; was it cut off?)")
	}
	if _, err := hex.Decode(t.CertHash[:], []byte(hashHex)); err != nil {
		return Token{}, fmt.Errorf("transport: token: certificate hash: %w", err)
	}
	if _, err := hex.Decode(t.Secret[:], []byte(secretHex)); err != nil {
		return Token{}, fmt.Errorf("transport: token: secret: %w", err)
	}
	return t, nil
}

// ReadTokenFile reads a token from a file such as a server's DIR/token.
func ReadTokenFile(path string) (Token, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Token{}, fmt.Errorf("transport: token file: %w", err)
	}
	t, err := ParseToken(string(data))
	if err != nil {
		return Token{}, fmt.Errorf("%w (in %s)", err, path)
	}
	return t, nil
}

// AdminToken is what an operator needs for a server's admin endpoint: the
// hash of the certificate the endpoint must present and a key derived from
// the cluster secret. The secret cannot be computed back from the key, so
// an admin token does not mount the file system.
type AdminToken struct {
	CertHash [32]byte
	Key      [32]byte
}

// Admin derives the admin token: the key is HMAC-SHA256 of a fixed label
// under the secret.
func (t Token) Admin() AdminToken {
	m := hmac.New(sha256.New, t.Secret[:])
	m.Write([]byte("leasefs admin credential v1"))
	a := AdminToken{CertHash: t.CertHash}
	copy(a.Key[:], m.Sum(nil))
	return a
}

// BlockKey derives the key that signs block capabilities (package blocks):
// HMAC-SHA256 of its own fixed label under the secret, as Admin's, so
// that every server of a cluster has it and the key gives nothing back
// of the secret or the admin credential.
func (t Token) BlockKey() [32]byte {
	m := hmac.New(sha256.New, t.Secret[:])
	m.Write([]byte("leasefs block capability key v1"))
	var k [32]byte
	copy(k[:], m.Sum(nil))
	return k
}

// String formats the admin token as ParseAdminToken reads it: "lfsadmin1-"
// + hex(certificate hash) + "-" + hex(key). It is the admin credential.
func (a AdminToken) String() string {
	return adminTokenPrefix + hex.EncodeToString(a.CertHash[:]) + "-" + hex.EncodeToString(a.Key[:])
}

// ParseAdminToken parses an admin token (DIR/admin-token), or a join token,
// from which it derives the admin token: the secret goes no further.
func ParseAdminToken(s string) (AdminToken, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, tokenPrefix) {
		t, err := ParseToken(s)
		return t.Admin(), err
	}
	var a AdminToken
	rest, ok := strings.CutPrefix(s, adminTokenPrefix)
	if !ok {
		return a, errors.New(`transport: admin token: does not start with "lfsadmin1-" or "lfs1-" (not a leasefs token, or from another version)`)
	}
	hashHex, keyHex, ok := strings.Cut(rest, "-")
	if !ok || len(hashHex) != 64 || len(keyHex) != 64 {
		return a, errors.New("transport: admin token: wrong length (want lfsadmin1-<64 hex digits>-<64 hex digits>; was it cut off?)")
	}
	if _, err := hex.Decode(a.CertHash[:], []byte(hashHex)); err != nil {
		return AdminToken{}, fmt.Errorf("transport: admin token: certificate hash: %w", err)
	}
	if _, err := hex.Decode(a.Key[:], []byte(keyHex)); err != nil {
		return AdminToken{}, fmt.Errorf("transport: admin token: key: %w", err)
	}
	return a, nil
}

// ReadAdminTokenFile reads DIR/admin-token, or a join token file (DIR/token)
// and derives the admin token from it.
func ReadAdminTokenFile(path string) (AdminToken, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return AdminToken{}, fmt.Errorf("transport: admin token file: %w", err)
	}
	a, err := ParseAdminToken(string(data))
	if err != nil {
		return AdminToken{}, fmt.Errorf("%w (in %s)", err, path)
	}
	return a, nil
}

// PinnedTLS is a TLS client configuration that accepts only the
// certificate whose SHA-256 is certHash (a token's pin): there is no CA to
// check. A mismatch fails the handshake with ErrWrongServer.
func PinnedTLS(certHash [32]byte) *tls.Config {
	return &tls.Config{
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 || sha256.Sum256(raw[0]) != certHash {
				return ErrWrongServer
			}
			return nil
		},
		ServerName: "leasefs",
		MinVersion: tls.VersionTLS13,
	}
}
