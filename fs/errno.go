package fs

import (
	"context"
	"errors"
	"syscall"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/wire"
)

var codeErrno = [...]syscall.Errno{
	wire.CodeOK: 0, wire.CodeNotFound: syscall.ENOENT, wire.CodeExists: syscall.EEXIST,
	wire.CodeNotEmpty: syscall.ENOTEMPTY, wire.CodeNotDir: syscall.ENOTDIR,
	wire.CodeIsDir: syscall.EISDIR, wire.CodeNameTooLong: syscall.ENAMETOOLONG,
	wire.CodeInvalid: syscall.EINVAL, wire.CodeNoData: syscall.ENODATA,
	wire.CodeRange: syscall.ERANGE, wire.CodeAccess: syscall.EACCES,
	wire.CodePerm: syscall.EPERM, wire.CodeIO: syscall.EIO, wire.CodeNoSpace: syscall.ENOSPC,
	wire.CodeStale: syscall.ESTALE, wire.CodeNack: syscall.EIO, wire.CodeAgain: syscall.EAGAIN,
	wire.CodeRedirect: syscall.EIO, wire.CodeTooBig: syscall.EFBIG,
	wire.CodeNotSupported: syscall.EOPNOTSUPP, wire.CodeBadMessage: syscall.EBADMSG,
	wire.CodeDeadlock: syscall.EDEADLK, wire.CodeCrossDevice: syscall.EXDEV,
	wire.CodeInterrupted: syscall.EINTR,
	wire.CodeUnavailable: syscall.EIO,
	wire.CodeNXIO:        syscall.ENXIO,
}

// toErrno converts an error from the client into the POSIX error the
// application sees; this is the one place where that happens.
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errors.Is(err, context.Canceled) {
		return syscall.EINTR
	}
	if errors.Is(err, client.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return syscall.EIO
	}
	var we *wire.Error
	if errors.As(err, &we) && int(we.Code) < len(codeErrno) {
		return codeErrno[we.Code]
	}
	return syscall.EIO
}
