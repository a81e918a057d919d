package wire

import "fmt"

// Code is the result of a request as the server application reports it. Any
// reply carrying a Code is an application reply, hence an ACK for the client
// lease, except CodeNack.
type Code uint16

const (
	CodeOK Code = iota
	CodeNotFound
	CodeExists
	CodeNotEmpty
	CodeNotDir
	CodeIsDir
	CodeNameTooLong
	CodeInvalid
	CodeNoData // no such xattr
	CodeRange  // buffer too small / value too large
	CodeAccess
	CodePerm
	CodeIO
	CodeNoSpace
	CodeStale    // file handle of a removed inode
	CodeNack     // the server does not know or is failing this session
	CodeAgain    // try again (a lock would block, no quorum yet)
	CodeRedirect // another server owns the inode
	CodeTooBig   // file too large
	CodeNotSupported
	CodeBadMessage // malformed request
	CodeDeadlock
	CodeCrossDevice
	CodeInterrupted
	// CodeUnavailable: this server cannot serve the request now (restart
	// quarantine, no majority of its cluster reachable); the client should
	// try another server of the cluster.
	CodeUnavailable
	CodeNXIO // lseek: no data or hole at or after the offset
	codeCount
)

var codeNames = [...]string{
	CodeOK: "ok", CodeNotFound: "not found", CodeExists: "exists",
	CodeNotEmpty: "directory not empty", CodeNotDir: "not a directory",
	CodeIsDir: "is a directory", CodeNameTooLong: "name too long",
	CodeInvalid: "invalid argument", CodeNoData: "no such attribute",
	CodeRange: "result too large", CodeAccess: "permission denied",
	CodePerm: "operation not permitted", CodeIO: "i/o error",
	CodeNoSpace: "no space", CodeStale: "stale file handle", CodeNack: "nack",
	CodeAgain: "try again", CodeRedirect: "redirect", CodeTooBig: "file too large",
	CodeNotSupported: "not supported", CodeBadMessage: "bad message",
	CodeDeadlock: "deadlock", CodeCrossDevice: "cross-device link",
	CodeInterrupted: "interrupted", CodeUnavailable: "server unavailable",
	CodeNXIO: "no such device or address",
}

func (c Code) String() string {
	if c < codeCount {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

var codeShort = [...]string{
	CodeOK: "ok", CodeNotFound: "enoent", CodeExists: "eexist", CodeNotEmpty: "enotempty",
	CodeNotDir: "enotdir", CodeIsDir: "eisdir", CodeNameTooLong: "enametoolong", CodeInvalid: "einval",
	CodeNoData: "enodata", CodeRange: "erange", CodeAccess: "eacces", CodePerm: "eperm", CodeIO: "eio",
	CodeNoSpace: "enospc", CodeStale: "estale", CodeNack: "nack", CodeAgain: "eagain",
	CodeRedirect: "redirect", CodeTooBig: "efbig", CodeNotSupported: "enotsup", CodeBadMessage: "ebadmsg",
	CodeDeadlock: "edeadlk", CodeCrossDevice: "exdev", CodeInterrupted: "eintr",
	CodeUnavailable: "unavailable", CodeNXIO: "enxio",
}

// Short is the code as a metric label: the errno's name in lower case
// (enoent, eacces), or ok, nack, redirect, unavailable.
func (c Code) Short() string {
	if c < codeCount {
		return codeShort[c]
	}
	return fmt.Sprintf("code%d", uint16(c))
}

// Error is an error carrying a Code, so a server-side failure crosses the
// wire and reaches fs/ as the same POSIX error.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Msg
}

// Is makes errors.Is(err, wire.Err(CodeNotFound)) match any message.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Msg == ""
}

// Err returns an *Error with the given code and no message.
func Err(c Code) error { return &Error{Code: c} }

// Errf returns an *Error with a code and a formatted message.
func Errf(c Code, format string, args ...any) error {
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf returns the Code an error carries, CodeIO for other errors and CodeOK
// for nil.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	for e := err; e != nil; {
		if we, ok := e.(*Error); ok {
			return we.Code
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return CodeIO
}
