package controller

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Auth guards the operator API and the dashboard. The listener is plain
// HTTP on loopback, where any local user and any web page the operator
// opens can reach it, so every request must carry the token, name an
// allowed Host (DNS rebinding), come from no foreign Origin, and send
// its body as JSON (a page's no-cors form POST cannot).
type Auth struct {
	// Token authenticates a request: "Authorization: Bearer <token>", or
	// the cookie GET /login?token=<token> sets. Empty: every request is
	// refused.
	Token string
	// Hosts are the Host header values (host:port, compared without
	// case) the API answers to; LoopbackHosts makes them for a listener.
	Hosts []string
}

// TokenFileName is the token file's name in the controller's state
// directory (beside its DB) unless the configuration names one.
const TokenFileName = "controller.token"

// Errors of the guard, converted to HTTP status in writeErr.
var (
	errUnauthenticated = errors.New("unauthenticated")
	errMisdirected     = errors.New("misdirected request")
	errMediaType       = errors.New("unsupported media type")
)

// authHelp is what a refused client is told.
const authHelp = "the controller's operator API needs its token: send \"Authorization: Bearer <token>\" " +
	"(the CLI reads it from the testbed, or --token / EDGEHOP_CONTROLLER_TOKEN), " +
	"or open the dashboard's login link; `edgehop testbed status` prints both and the token file's path"

// LoopbackHosts returns the Host values of a listener at listen: the
// address itself, and localhost, 127.0.0.1 and [::1] at its port, then
// extra.
func LoopbackHosts(listen string, extra ...string) []string {
	hosts := []string{listen}
	if _, port, err := net.SplitHostPort(listen); err == nil {
		for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
			hosts = append(hosts, net.JoinHostPort(h, port))
		}
	}
	return append(hosts, extra...)
}

// LoginURL is the dashboard's login link of the controller at base.
func LoginURL(base, token string) string {
	return strings.TrimRight(base, "/") + "/login?token=" + url.QueryEscape(token)
}

// guard is Auth in force over a handler.
type guard struct {
	sum   [sha256.Size]byte // of the token; zero with no token
	token bool
	hosts map[string]bool // lower case
	next  http.Handler
}

func (a Auth) wrap(next http.Handler) *guard {
	g := &guard{token: a.Token != "", hosts: map[string]bool{}, next: next}
	if g.token {
		g.sum = sha256.Sum256([]byte(a.Token))
	}
	for _, h := range a.Hosts {
		g.hosts[strings.ToLower(h)] = true
	}
	return g
}

// match compares in constant time; hashing first makes the time
// independent of the length too.
func (g *guard) match(tok string) bool {
	sum := sha256.Sum256([]byte(tok))
	return g.token && subtle.ConstantTimeCompare(sum[:], g.sum[:]) == 1
}

// cookieName is per port: cookies are shared by every port of a host,
// and two testbeds' controllers may both serve on 127.0.0.1.
func cookieName(host string) string {
	if _, port, err := net.SplitHostPort(host); err == nil && port != "" {
		return "edgehop_token_" + port
	}
	return "edgehop_token"
}

func (g *guard) authenticated(r *http.Request) bool {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		return ok && strings.EqualFold(scheme, "Bearer") && g.match(strings.TrimSpace(tok))
	}
	c, err := r.Cookie(cookieName(r.Host))
	return err == nil && g.match(c.Value)
}

func (g *guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	if !g.hosts[strings.ToLower(r.Host)] {
		writeErr(w, fmt.Errorf("%w: host %q is not this controller's (allowed: the listen address, localhost, 127.0.0.1, [::1] at its port, and the configured hosts)", errMisdirected, r.Host))
		return
	}
	if err := g.sameOrigin(r); err != nil {
		writeErr(w, err)
		return
	}
	if r.URL.Path == "/login" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		g.login(w, r)
		return
	}
	if !g.authenticated(r) {
		h.Set("WWW-Authenticate", `Bearer realm="edgehop controller"`)
		writeErr(w, fmt.Errorf("%w: %s", errUnauthenticated, authHelp))
		return
	}
	if err := jsonBody(r); err != nil {
		writeErr(w, err)
		return
	}
	g.next.ServeHTTP(w, r)
}

// sameOrigin refuses a request a browser sent from another origin.
func (g *guard) sameOrigin(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !g.hosts[strings.ToLower(u.Host)] || u.Path != "" {
			return fmt.Errorf("%w: cross-origin request from %q", errForbidden, o)
		}
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		if s := r.Header.Get("Sec-Fetch-Site"); s == "cross-site" || s == "same-site" {
			return fmt.Errorf("%w: %s %s from a %s page", errForbidden, r.Method, r.URL.Path, s)
		}
	}
	return nil
}

// jsonBody refuses a body that is not JSON: a page's no-cors POST can
// send only text/plain, form or multipart bodies.
func jsonBody(r *http.Request) error {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return nil
	}
	if r.ContentLength == 0 {
		return nil
	}
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		return fmt.Errorf("%w: %s %s: the body must be Content-Type application/json, not %q", errMediaType, r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	}
	return nil
}

// login sets the dashboard's cookie and redirects to the dashboard,
// keeping the other query parameters (/login?token=T&nostream goes to
// /?nostream).
func (g *guard) login(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	tok := r.URL.Query().Get("token")
	if !g.match(tok) {
		writeErr(w, fmt.Errorf("%w: wrong or missing token in /login?token=; %s", errUnauthenticated, authHelp))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName(r.Host), Value: tok, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	var keep []string
	for _, kv := range strings.Split(r.URL.RawQuery, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if k, err := url.QueryUnescape(k); kv != "" && err == nil && k != "token" {
			keep = append(keep, kv)
		}
	}
	to := "/"
	if len(keep) > 0 {
		to += "?" + strings.Join(keep, "&")
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// LoadOrCreateToken returns the token kept in path, making a random one
// (32 bytes, hex) in a new file of mode 0600 the first time. A token
// file others may read is refused: that token is to be replaced.
func LoadOrCreateToken(path string) (string, error) {
	tok, err := readToken(path, true)
	if !errors.Is(err, fs.ErrNotExist) {
		return tok, err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok = hex.EncodeToString(b[:])
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	// Written whole under another name, then linked: a reader never sees
	// half a token, and of two controllers starting at once one wins.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".token-*")
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.WriteString(tok + "\n")
	if err := errors.Join(werr, tmp.Chmod(0o600), tmp.Sync(), tmp.Close()); err != nil {
		return "", fmt.Errorf("write token file %s: %w", path, err)
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		return readToken(path, true)
	} else if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	return tok, nil
}

// ReadToken reads the token file at path (a client's side).
func ReadToken(path string) (string, error) { return readToken(path, false) }

func readToken(path string, private bool) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("controller token: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("controller token: %w", err)
	}
	if private && fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("controller token file %s has mode %o: others may have read it; remove it (a new one is made at start) or chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", fmt.Errorf("read controller token %s: %w", path, err)
	}
	tok := strings.TrimSpace(string(b))
	if err := checkToken(tok); err != nil {
		return "", fmt.Errorf("controller token file %s: %w", path, err)
	}
	return tok, nil
}

// checkToken: at least 32 characters of hex or base64url, so that it is
// hard to guess and fits a header and a cookie as it is.
func checkToken(tok string) error {
	if len(tok) < 32 {
		return fmt.Errorf("token of %d characters: want at least 32", len(tok))
	}
	for _, c := range tok {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return errors.New("token: want hex or base64url characters only")
		}
	}
	return nil
}

// Timeouts of the controller's HTTP servers. The event stream lifts the
// read deadline and moves the write deadline on before each write.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 60 * time.Second
	idleTimeout       = 2 * time.Minute
)

// NewServer is an http.Server for h with the controller's timeouts;
// errLog may be nil.
func NewServer(h http.Handler, errLog *log.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
		WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, ErrorLog: errLog}
}
