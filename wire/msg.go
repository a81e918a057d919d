package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/leasefs/leasefs/internal/ids"
)

// Op is a request's operation.
type Op uint8

const (
	OpOpenSession Op = iota + 1
	OpRenew          // explicit lease renewal: carries nothing
	OpLookup
	OpGetAttr
	OpSetAttr
	OpCreate
	OpMkdir
	OpSymlink
	OpReadlink
	OpLink
	OpUnlink
	OpRmdir
	OpRename
	OpReadDir // entries of Ino after cookie Off, at most Size; fewer only at the end
	OpOpen
	OpRelease
	OpRead
	OpWrite
	OpFsync
	OpStatFs
	OpGetXattr
	OpSetXattr
	OpListXattr
	OpRemoveXattr
	OpLock        // acquire a data lock (LockMode) on Ino
	OpLockRelease // release or downgrade a data lock to LockMode
	OpPosixLock   // flock/fcntl: Lk
	OpReclaim     // after a NACK or server restart: reclaim LockMode on Ino based on Version
	OpGoodbye     // clean unmount: forget the session now
	OpBatch       // changes of one directory, executed in order: Data holds them (AppendBatch)
	OpAllocInos   // hand the client Size inode numbers for creates behind it (CreateIno); Data: AppendInoRange
	// OpBlockAccess asks for capabilities for blocks of Ino (Data:
	// AppendUniques; Flags: BlockWrite), one per block in Names, in order.
	OpBlockAccess
	// OpCommitBlocks commits blocks the client put in the block store
	// under its X lock on Ino, and the file ranges they back (Data:
	// AppendCommit); the size becomes at least Size. A change (ReqID).
	OpCommitBlocks
	// OpLookupBlocks returns the pieces of [Off, Off+Size) of Ino (Data:
	// AppendPieces, at most MaxPieces: the client asks again from where
	// they end) and its attributes, under an S lock as OpRead. For a file
	// whose data is in pages (of any size: see InlineMax) the reply's
	// Flags hold InlineData and Data is the file's bytes from Off, as
	// OpRead answers them: at most MaxData, fewer at its end.
	OpLookupBlocks
	// OpSeek is lseek's SEEK_DATA or SEEK_HOLE (Flags: SeekData or
	// SeekHole) from Off in Ino, under an S lock as OpRead: the reply's
	// Data is the offset found (AppendOffset), or the error is CodeNXIO.
	OpSeek
	// OpPunch is fallocate's PUNCH_HOLE or ZERO_RANGE (Flags: PunchKeepSize,
	// PunchHole, PunchZeroRange, fallocate's mode bits) of Size bytes from
	// Off in Ino, under an X lock as OpWrite; the reply carries the
	// attributes.
	OpPunch
	opEnd
)

var opNames = [...]string{
	OpOpenSession: "open-session", OpRenew: "renew", OpLookup: "lookup",
	OpGetAttr: "getattr", OpSetAttr: "setattr", OpCreate: "create",
	OpMkdir: "mkdir", OpSymlink: "symlink", OpReadlink: "readlink",
	OpLink: "link", OpUnlink: "unlink", OpRmdir: "rmdir", OpRename: "rename",
	OpReadDir: "readdir", OpOpen: "open", OpRelease: "release", OpRead: "read",
	OpWrite: "write", OpFsync: "fsync", OpStatFs: "statfs",
	OpGetXattr: "getxattr", OpSetXattr: "setxattr", OpListXattr: "listxattr",
	OpRemoveXattr: "removexattr", OpLock: "lock", OpLockRelease: "lock-release",
	OpPosixLock: "posix-lock", OpReclaim: "reclaim", OpGoodbye: "goodbye", OpBatch: "batch",
	OpAllocInos: "alloc-inos", OpBlockAccess: "block-access",
	OpCommitBlocks: "commit-blocks", OpLookupBlocks: "lookup-blocks",
	OpSeek: "seek", OpPunch: "punch",
}

func (o Op) String() string {
	if o > 0 && o < opEnd {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Valid reports whether o is a known operation.
func (o Op) Valid() bool { return o > 0 && o < opEnd }

// Changes reports whether o changes the file system, so that applying it
// twice could differ from applying it once: such requests carry a ReqID.
// Owned reports whether o must be served by the owner of its inode
// (Request.Home) in a cluster: a server that does not own it redirects
// the client. Session upkeep is not, nor is giving back what this very
// server handed out (a data lock, an open handle, POSIX locks of an owner).
func (o Op) Owned() bool {
	switch o {
	case OpOpenSession, OpRenew, OpGoodbye, OpStatFs, OpLockRelease, OpRelease, OpAllocInos:
		return false
	}
	return o > 0 && o < opEnd
}

func (o Op) Changes() bool {
	switch o {
	case OpSetAttr, OpCreate, OpMkdir, OpSymlink, OpLink, OpUnlink, OpRmdir, OpRename,
		OpWrite, OpSetXattr, OpRemoveXattr, OpCommitBlocks, OpPunch:
		return true
	}
	return false
}

// Ops lists every operation, for metrics.
func Ops() []Op {
	out := make([]Op, 0, opEnd-1)
	for o := Op(1); o < opEnd; o++ {
		out = append(out, o)
	}
	return out
}

// OriginIno is the inode a server records a change's ReqID with: one the
// change writes under an X lock (the directory of a change of names).
// Oldest counts changes of this inode only.
func (r *Request) OriginIno() ids.Ino {
	switch r.Op {
	case OpCreate, OpMkdir, OpSymlink, OpUnlink, OpRmdir, OpRename:
		return r.Parent
	case OpLink:
		return r.NewPar
	}
	return r.Ino
}

// OpWrite flags.
const (
	// WriteAppend writes at the end of the file as the server sees it.
	WriteAppend uint32 = 1 << iota
	// WriteIfVersion writes only if the file's version is still Version
	// (reclaiming buffered writes after a NACK); else CodeStale.
	WriteIfVersion
)

// OpCreate flags.
const (
	// CreateOpen also opens the new file (one round trip for
	// open(O_CREAT)).
	CreateOpen uint32 = 1 << iota
	// CreateIno makes the file with inode number Ino, one the server
	// handed this client (OpAllocInos), and times Mtime: the client sent
	// the create behind its caller and answered it already.
	CreateIno
)

// MaxInoRange bounds the inode numbers one OpAllocInos hands out.
const MaxInoRange = 4096

// AppendInoRange appends an OpAllocInos reply: n numbers from first on.
func AppendInoRange(b []byte, first ids.Ino, n uint32) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(first))
	return binary.BigEndian.AppendUint32(b, n)
}

// ParseInoRange reads an OpAllocInos reply.
func ParseInoRange(b []byte) (first ids.Ino, n uint32, err error) {
	if len(b) != 12 {
		return 0, 0, Errf(CodeBadMessage, "inode range of %d bytes, want 12", len(b))
	}
	first, n = ids.Ino(binary.BigEndian.Uint64(b)), binary.BigEndian.Uint32(b[8:])
	if first == 0 || n == 0 || n > MaxInoRange {
		return 0, 0, Errf(CodeBadMessage, "inode range %v+%d", first, n)
	}
	return first, n, nil
}

// BlockWrite in an OpBlockAccess request's Flags asks for write
// capabilities (the client must hold the file's X lock); without it, read
// capabilities (S or X). BlockURL asks for presigned URLs of an
// object store's blocks instead of capabilities for the server's endpoint.
const (
	BlockWrite uint32 = 1 << iota
	BlockURL
)

// MaxBlockAccess bounds the blocks one OpBlockAccess asks for.
const MaxBlockAccess = 1024

// AppendUniques encodes the blocks' unique parts of an OpBlockAccess
// request: 16 bytes each.
func AppendUniques(b []byte, uniques [][16]byte) []byte {
	for _, u := range uniques {
		b = append(b, u[:]...)
	}
	return b
}

// ParseUniques reads what AppendUniques wrote.
func ParseUniques(b []byte) ([][16]byte, error) {
	if len(b) == 0 || len(b)%16 != 0 || len(b)/16 > MaxBlockAccess {
		return nil, Errf(CodeBadMessage, "block list of %d bytes, want 16 each, 1..%d blocks", len(b), MaxBlockAccess)
	}
	out := make([][16]byte, len(b)/16)
	for i := range out {
		copy(out[i][:], b[16*i:])
	}
	return out, nil
}

// RemoveIfIno in an OpUnlink or OpRmdir request's Flags removes the name
// only if it still names Ino (else CodeNotFound): a removal the client sent
// behind its caller may be resent after a NACK, when the name may name a
// file created since.
const RemoveIfIno uint32 = 1

// PosixReleaseOwner in an OpPosixLock request's Flags drops every lock of
// Lk.Owner on the inode (its file was closed).
const PosixReleaseOwner uint32 = 1

// SetAttr valid bits.
const (
	SetMode uint32 = 1 << iota
	SetUid
	SetGid
	SetSize
	SetAtime
	SetMtime
	SetAtimeNow
	SetMtimeNow
	SetCtime
	// SetKillSuidgid clears the setuid bit, and the setgid bit if the
	// group may execute, from the mode as the change finds it (after a
	// SetMode with it): what a write by a caller without CAP_FSETID does
	// (the kernel's FUSE_WRITE_KILL_SUIDGID).
	SetKillSuidgid
)

// WriteAttrs are the attribute changes an OpWrite may carry in Valid, made
// after the write in the same transaction: a client that buffered a chmod,
// chown or utimes behind its writes sends them in one request.
const WriteAttrs = SetMode | SetUid | SetGid | SetAtime | SetMtime | SetCtime | SetKillSuidgid

// XattrKillSgid in an OpSetXattr request's Flags (beside XATTR_CREATE and
// XATTR_REPLACE) clears the file's setgid bit as the access ACL it sets
// changes the mode: the caller is neither in the file's group nor
// privileged (the kernel's FUSE_SETXATTR_ACL_KILL_SGID).
const XattrKillSgid uint32 = 1 << 8

// Attr is an inode's attributes as the server stores them.
type Attr struct {
	Ino                 ids.Ino
	Mode, Nlink         uint32
	Uid, Gid, Rdev      uint32
	Size, Blocks        uint64
	Atime, Mtime, Ctime int64  // unix nanoseconds
	Version             uint64 // the file data's version (Request.Version)
	// Change counts the changes of the inode's attributes at the server:
	// of two replies about the inode, the one with the greater Change
	// holds the newer attributes (wire version 4).
	Change uint64
}

func (e *enc) attr(a *Attr) {
	e.U64(uint64(a.Ino))
	e.U32(a.Mode)
	e.U32(a.Nlink)
	e.U32(a.Uid)
	e.U32(a.Gid)
	e.U32(a.Rdev)
	e.U64(a.Size)
	e.U64(a.Blocks)
	e.I64(a.Atime)
	e.I64(a.Mtime)
	e.I64(a.Ctime)
	e.U64(a.Version)
	e.U64(a.Change)
}

func (d *dec) attr(a *Attr) {
	a.Ino = ids.Ino(d.U64())
	a.Mode = d.U32()
	a.Nlink = d.U32()
	a.Uid = d.U32()
	a.Gid = d.U32()
	a.Rdev = d.U32()
	a.Size = d.U64()
	a.Blocks = d.U64()
	a.Atime = d.I64()
	a.Mtime = d.I64()
	a.Ctime = d.I64()
	a.Version = d.U64()
	a.Change = d.U64()
}

// DirEntry is one directory entry; Off is the cookie to continue after it.
type DirEntry struct {
	Name string
	Ino  ids.Ino
	Mode uint32
	Off  uint64
}

// SortByName puts entries in name order: the order of a listing a client
// serves from its cache, whose offsets number its places in that order.
func SortByName(ents []DirEntry) {
	slices.SortFunc(ents, func(a, b DirEntry) int { return strings.Compare(a.Name, b.Name) })
}

// LockMode is a data lock mode.
type LockMode uint8

const (
	LockNone LockMode = iota
	LockShared
	LockExclusive
)

func (m LockMode) String() string {
	switch m {
	case LockNone:
		return "none"
	case LockShared:
		return "S"
	case LockExclusive:
		return "X"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// PosixLk is a POSIX advisory lock request or a conflicting lock.
type PosixLk struct {
	Flock      bool  // flock(2) namespace instead of fcntl
	Type       uint8 // syscall.F_RDLCK, F_WRLCK, F_UNLCK
	Wait       bool  // F_SETLKW / blocking flock
	Get        bool  // F_GETLK: only report a conflict
	Start, End uint64
	Pid        uint32
	Owner      uint64
}

func (e *enc) lk(l *PosixLk) {
	var f uint8
	if l.Flock {
		f |= 1
	}
	if l.Wait {
		f |= 2
	}
	if l.Get {
		f |= 4
	}
	e.U8(f)
	e.U8(l.Type)
	e.U64(l.Start)
	e.U64(l.End)
	e.U32(l.Pid)
	e.U64(l.Owner)
}

func (d *dec) lk(l *PosixLk) {
	f := d.U8()
	l.Flock, l.Wait, l.Get = f&1 != 0, f&2 != 0, f&4 != 0
	l.Type = d.U8()
	l.Start = d.U64()
	l.End = d.U64()
	l.Pid = d.U32()
	l.Owner = d.U64()
}

// Request is every operation's arguments in one flat struct: each op uses the
// fields it needs and the rest travel as zeros. One shape keeps encoding,
// fuzzing and logging in one place; the cost is a few dozen bytes.
type Request struct {
	Op                   Op
	Ino, Parent, NewPar  ids.Ino
	Name, NewName        string
	Target               string // symlink target, hostname for OpOpenSession
	Mode, Uid, Gid, Rdev uint32
	// Umask is the creator's umask (OpCreate, OpMkdir): Mode comes
	// without it, and it applies only where the directory has no default
	// ACL (POSIX.1e; a default ACL masks the mode instead).
	Umask               uint32
	Flags, Valid        uint32
	Off, Size           uint64
	Atime, Mtime, Ctime int64
	LockMode            LockMode
	Version             uint64 // reclaim: the version dirty data was based on
	// ReqID names a change (Op.Changes) across resends: a server that
	// finds it applied answers from the current state (client ID + ReqID
	// is unique; 0: not a change).
	ReqID uint64
	// Oldest is the oldest change with the same OriginIno the client had
	// in flight when it made this one: every change of that inode before
	// it is finished for the client, and a copy of one arriving late (at
	// a server the client gave up on) must not be applied.
	Oldest uint64
	// Opens is how many handles the client opened on Ino under its data
	// lock without telling the server (OpenedLocally). The server counts
	// them as opened before it executes the request, so that the file
	// outlives its last link while they are open: the client sends them
	// when it removes the file itself (OpUnlink, OpRename over it).
	Opens uint32
	// NoRedirect asks a server that does not own Home to serve the request
	// anyway (taking the inode over) instead of redirecting: the client
	// followed redirects long enough, or cannot reach the owner.
	NoRedirect bool
	Lk         PosixLk
	// Spans, if set, make an OpWrite a vectored write: Data holds these
	// ranges' bytes one after another (ascending, disjoint ranges; Off is
	// unused). A client flushing scattered buffered writes sends them in
	// a few requests instead of one per write.
	Spans []Span
	Data  []byte
}

// Home is the inode whose owner serves r in a cluster: the directory of a
// change to a name, else the inode itself.
func (r *Request) Home() ids.Ino {
	if r.Parent != 0 {
		return r.Parent
	}
	return r.Ino
}

// Span is one range of a vectored write.
type Span struct {
	Off uint64
	Len uint32
}

// checkSpans checks that spans are ascending, disjoint, non-empty ranges
// that together hold n bytes.
func checkSpans(spans []Span, n int) error {
	if len(spans) == 0 {
		return nil
	}
	total := 0
	var end uint64
	for i, sp := range spans {
		if sp.Len == 0 || sp.Off+uint64(sp.Len) < sp.Off || (i > 0 && sp.Off < end) {
			return fmt.Errorf("%w: span %d (%d+%d) is empty, wraps or overlaps the one before", ErrBadSpans, i, sp.Off, sp.Len)
		}
		end = sp.Off + uint64(sp.Len)
		total += int(sp.Len)
	}
	if total != n {
		return fmt.Errorf("%w: spans hold %d bytes, data has %d", ErrBadSpans, total, n)
	}
	return nil
}

// Append encodes r after b.
func (r *Request) Append(b []byte) []byte {
	return append(r.AppendHead(b), r.Data...)
}

// AppendHead encodes r after b but for Data's bytes, which follow in the
// encoding: a sender that writes them from where they are copies nothing.
func (r *Request) AppendHead(b []byte) []byte {
	e := newEnc(b)
	e.U8(Version)
	e.U8(uint8(r.Op))
	e.U64(uint64(r.Ino))
	e.U64(uint64(r.Parent))
	e.U64(uint64(r.NewPar))
	e.Str(r.Name)
	e.Str(r.NewName)
	e.Str(r.Target)
	e.U32(r.Mode)
	e.U32(r.Uid)
	e.U32(r.Gid)
	e.U32(r.Rdev)
	e.U32(r.Umask)
	e.U32(r.Flags)
	e.U32(r.Valid)
	e.U64(r.Off)
	e.U64(r.Size)
	e.I64(r.Atime)
	e.I64(r.Mtime)
	e.I64(r.Ctime)
	e.U8(uint8(r.LockMode))
	e.U64(r.Version)
	e.U64(r.ReqID)
	e.U64(r.Oldest)
	e.U32(r.Opens)
	e.Bool(r.NoRedirect)
	e.lk(&r.Lk)
	e.U32(uint32(len(r.Spans)))
	for _, sp := range r.Spans {
		e.U64(sp.Off)
		e.U32(sp.Len)
	}
	e.U32(uint32(len(r.Data)))
	return e.B
}

// RequestHead is the start of every request body: its operation and the
// inode it is about.
type RequestHead struct {
	Op  Op
	Ino ids.Ino
}

func (h *RequestHead) parse(d *dec) {
	d.version()
	h.Op = Op(d.U8())
	h.Ino = ids.Ino(d.U64())
}

// ParseRequestHead decodes the head of a request body (of which the rest
// need not be there).
func ParseRequestHead(b []byte) (RequestHead, error) {
	d := newDec(b)
	var h RequestHead
	h.parse(&d)
	return h, d.Err()
}

// ParseRequest decodes a request body. Data aliases b.
func ParseRequest(b []byte) (*Request, error) {
	d := newDec(b)
	var h RequestHead
	h.parse(&d)
	r := &Request{Op: h.Op, Ino: h.Ino}
	r.Parent = ids.Ino(d.U64())
	r.NewPar = ids.Ino(d.U64())
	r.Name = d.Str(MaxName)
	r.NewName = d.Str(MaxName)
	r.Target = d.Str(MaxPath)
	r.Mode = d.U32()
	r.Uid = d.U32()
	r.Gid = d.U32()
	r.Rdev = d.U32()
	r.Umask = d.U32()
	r.Flags = d.U32()
	r.Valid = d.U32()
	r.Off = d.U64()
	r.Size = d.U64()
	r.Atime = d.I64()
	r.Mtime = d.I64()
	r.Ctime = d.I64()
	r.LockMode = LockMode(d.U8())
	r.Version = d.U64()
	r.ReqID = d.U64()
	r.Oldest = d.U64()
	r.Opens = d.U32()
	r.NoRedirect = d.Bool()
	d.lk(&r.Lk)
	if n := d.Count(MaxSpans, 12); n > 0 {
		r.Spans = make([]Span, n)
		for i := range r.Spans {
			r.Spans[i] = Span{Off: d.U64(), Len: d.U32()}
		}
	}
	r.Data = d.Bytes(MaxData)
	if err := d.End(); err != nil {
		return nil, err
	}
	if err := checkSpans(r.Spans, len(r.Data)); err != nil {
		return nil, err
	}
	if !r.Op.Valid() {
		return nil, fmt.Errorf("%w %d", ErrUnknown, r.Op)
	}
	if r.LockMode > LockExclusive {
		return nil, fmt.Errorf("wire: bad lock mode %d", r.LockMode)
	}
	if r.Opens > MaxOpens {
		return nil, fmt.Errorf("%w: %d open handles", ErrTooLarge, r.Opens)
	}
	return r, nil
}

// Session is what the server tells a client when a session opens.
type Session struct {
	ID       ids.SessionID
	Server   ids.ServerID
	Tau      int64   // client lease period, nanoseconds
	Delta    float64 // clock-rate error bound
	GraceEnd int64   // nanoseconds from now until the server grants locks again (restart grace)
	Blocks   BlockStore
}

// BlockStore is where a server keeps file blocks, as the session open
// tells the mount: Kind "file" is a directory (Dir, as the server sees it,
// store id StoreID), "s3" an object store (Dir s3://BUCKET/PREFIX), both
// served over HTTPS at Addr (HOST:PORT; an empty host: the one the mount
// reached the server at, for a server on 0.0.0.0). Kind "" is none.
type BlockStore struct {
	Kind, Dir, StoreID, Addr string
	// KeepFree is the free space a mount's Put into Dir must leave on its
	// file system: the room the server's metadata store needs when both
	// share one (0: none to keep).
	KeepFree uint64
	Endpoint string // "s3": the object store's URL, which presigned URLs name
}

// StatFs is file system usage.
type StatFs struct {
	Blocks, Bfree, Bavail, Files, Ffree uint64
	Bsize, NameLen                      uint32
}

// Grant is a data lock granted to the client. Seq orders grants and
// revocations of one inode, which may arrive out of order.
type Grant struct {
	Ino  ids.Ino  `json:"ino"`
	Mode LockMode `json:"mode"`
	Seq  uint64   `json:"seq"`
}

// Reply sections present, as bits of a presence mask.
const (
	hasAttr uint16 = 1 << iota
	hasEntries
	hasData
	hasNames
	hasSession
	hasStatFs
	hasGrant
	hasLk
	hasAttr2
	hasOpens
	hasOwner
	hasFlags
)

// Reply flags (Reply.Flags).
const (
	// DirNoDefaultACL, in the reply to a change of a directory's entries,
	// says the directory has no default ACL: what is made in it inherits
	// no ACL, and its mode is the creator's masked by the umask. The
	// client may then make files in it itself (client/createbehind.go).
	DirNoDefaultACL uint32 = 1 << iota
	// InlineData, in the reply to an OpLookupBlocks, says Data is the
	// file's bytes from Off (fewer at its end), not pieces: the file is
	// small and keeps its data in the metadata store (InlineMax), so a
	// read costs one round trip and no block store access.
	InlineData
)

// InlineMax is the size up to which a file may keep its data in the
// metadata store, beside its attributes: a write past it makes the file
// block-mapped. Most files a build or an untar makes are smaller, and
// for them a block in the block store would cost a file create and an
// fsync each.
const InlineMax = 64 << 10

// Reply is the server application's answer. Any reply, whatever its Code
// except CodeNack, is an ACK for the client lease.
type Reply struct {
	Code    Code
	Msg     string
	Attr    *Attr
	Attr2   *Attr // second inode touched (the parent of a new entry, a replaced target)
	Entries []DirEntry
	Data    []byte
	Names   []string
	Session *Session
	StatFs  *StatFs
	Grants  []Grant // data locks the server granted with this reply
	Lk      *PosixLk
	// Opens, in a revocation's acknowledgement, is how many handles the
	// client opened locally on the inode under the lock it gave up (see
	// Request.Opens): the server counts them before the lock goes.
	Opens uint32
	// Owner, with CodeRedirect, is the server that owns the request's
	// inode as far as the answering server knows.
	Owner ids.ServerID
	// Flags are facts the reply states beside its sections (DirNoDefaultACL).
	Flags uint32

	encoded []byte // what ParseReply parsed; Data points into it
}

// Encoded returns the bytes ParseReply parsed r from (nil for a reply
// built here), for a caller that recycles them once done with Data.
func (r *Reply) Encoded() []byte { return r.encoded }

// Err returns the reply's error, nil for CodeOK.
func (r *Reply) Err() error {
	if r.Code == CodeOK {
		return nil
	}
	return &Error{Code: r.Code, Msg: r.Msg}
}

// ErrorReply builds the reply for err.
func ErrorReply(err error) *Reply {
	r := &Reply{Code: CodeOf(err)}
	if we, ok := err.(*Error); ok {
		r.Msg = we.Msg
	} else if err != nil && r.Code == CodeIO {
		r.Msg = err.Error()
	}
	return r
}

// Append encodes r after b.
func (r *Reply) Append(b []byte) []byte {
	e := newEnc(b)
	e.U8(Version)
	e.U16(uint16(r.Code))
	e.Str(r.Msg)
	var mask uint16
	if r.Attr != nil {
		mask |= hasAttr
	}
	if r.Entries != nil {
		mask |= hasEntries
	}
	if r.Data != nil {
		mask |= hasData
	}
	if r.Names != nil {
		mask |= hasNames
	}
	if r.Session != nil {
		mask |= hasSession
	}
	if r.StatFs != nil {
		mask |= hasStatFs
	}
	if r.Grants != nil {
		mask |= hasGrant
	}
	if r.Lk != nil {
		mask |= hasLk
	}
	if r.Attr2 != nil {
		mask |= hasAttr2
	}
	if r.Opens != 0 {
		mask |= hasOpens
	}
	if r.Owner != 0 {
		mask |= hasOwner
	}
	if r.Flags != 0 {
		mask |= hasFlags
	}
	e.U16(mask)
	if r.Attr != nil {
		e.attr(r.Attr)
	}
	if r.Attr2 != nil {
		e.attr(r.Attr2)
	}
	if r.Entries != nil {
		e.U32(uint32(len(r.Entries)))
		for i := range r.Entries {
			de := &r.Entries[i]
			e.Str(de.Name)
			e.U64(uint64(de.Ino))
			e.U32(de.Mode)
			e.U64(de.Off)
		}
	}
	if r.Data != nil {
		e.Bytes(r.Data)
	}
	if r.Names != nil {
		e.U32(uint32(len(r.Names)))
		for _, n := range r.Names {
			e.Str(n)
		}
	}
	if s := r.Session; s != nil {
		e.U64(uint64(s.ID))
		e.U8(uint8(s.Server))
		e.I64(s.Tau)
		e.U64(math.Float64bits(s.Delta))
		e.I64(s.GraceEnd)
		e.Str(s.Blocks.Kind)
		e.Str(s.Blocks.Dir)
		e.Str(s.Blocks.StoreID)
		e.Str(s.Blocks.Addr)
		e.U64(s.Blocks.KeepFree)
		e.Str(s.Blocks.Endpoint)
	}
	if s := r.StatFs; s != nil {
		e.U64(s.Blocks)
		e.U64(s.Bfree)
		e.U64(s.Bavail)
		e.U64(s.Files)
		e.U64(s.Ffree)
		e.U32(s.Bsize)
		e.U32(s.NameLen)
	}
	if r.Grants != nil {
		e.U32(uint32(len(r.Grants)))
		for _, g := range r.Grants {
			e.U64(uint64(g.Ino))
			e.U8(uint8(g.Mode))
			e.U64(g.Seq)
		}
	}
	if r.Lk != nil {
		e.lk(r.Lk)
	}
	if r.Opens != 0 {
		e.U32(r.Opens)
	}
	if r.Owner != 0 {
		e.U8(uint8(r.Owner))
	}
	if r.Flags != 0 {
		e.U32(r.Flags)
	}
	return e.B
}

// ReplyHead is the start of every reply body: how the request went.
type ReplyHead struct{ Code Code }

func (h *ReplyHead) parse(d *dec) {
	d.version()
	h.Code = Code(d.U16())
}

// ParseReplyHead decodes the head of a reply body (of which the rest need
// not be there).
func ParseReplyHead(b []byte) (ReplyHead, error) {
	if err := refused(b); err != nil {
		return ReplyHead{}, err
	}
	d := newDec(b)
	var h ReplyHead
	h.parse(&d)
	return h, d.Err()
}

// ParseReply decodes a reply body. Data aliases b.
func ParseReply(b []byte) (*Reply, error) {
	if err := refused(b); err != nil {
		return nil, err
	}
	d := newDec(b)
	var h ReplyHead
	h.parse(&d)
	r := &Reply{encoded: b, Code: h.Code}
	r.Msg = d.Str(MaxPath)
	mask := d.U16()
	if mask&hasAttr != 0 {
		r.Attr = new(Attr)
		d.attr(r.Attr)
	}
	if mask&hasAttr2 != 0 {
		r.Attr2 = new(Attr)
		d.attr(r.Attr2)
	}
	if mask&hasEntries != 0 {
		n := d.Count(MaxEntries, 4+8+4+8)
		r.Entries = make([]DirEntry, n)
		for i := range r.Entries {
			de := &r.Entries[i]
			de.Name = d.Str(MaxName)
			de.Ino = ids.Ino(d.U64())
			de.Mode = d.U32()
			de.Off = d.U64()
		}
	}
	if mask&hasData != 0 {
		r.Data = d.Bytes(MaxData)
		if r.Data == nil && d.Err() == nil {
			r.Data = []byte{}
		}
	}
	if mask&hasNames != 0 {
		n := d.Count(MaxList, 4)
		r.Names = make([]string, n)
		for i := range r.Names {
			r.Names[i] = d.Str(MaxName)
		}
	}
	if mask&hasSession != 0 {
		r.Session = &Session{
			ID:     ids.SessionID(d.U64()),
			Server: ids.ServerID(d.U8()),
			Tau:    d.I64(),
			Delta:  math.Float64frombits(d.U64()),
		}
		r.Session.GraceEnd = d.I64()
		bs := &r.Session.Blocks
		bs.Kind = d.Str(MaxName)
		bs.Dir = d.Str(MaxPath)
		bs.StoreID = d.Str(MaxName)
		bs.Addr = d.Str(MaxName)
		bs.KeepFree = d.U64()
		bs.Endpoint = d.Str(MaxPath)
	}
	if mask&hasStatFs != 0 {
		r.StatFs = &StatFs{Blocks: d.U64(), Bfree: d.U64(), Bavail: d.U64(), Files: d.U64(), Ffree: d.U64()}
		r.StatFs.Bsize = d.U32()
		r.StatFs.NameLen = d.U32()
	}
	if mask&hasGrant != 0 {
		n := d.Count(MaxEntries, 17)
		r.Grants = make([]Grant, n)
		for i := range r.Grants {
			r.Grants[i] = Grant{Ino: ids.Ino(d.U64()), Mode: LockMode(d.U8()), Seq: d.U64()}
		}
	}
	if mask&hasLk != 0 {
		r.Lk = new(PosixLk)
		d.lk(r.Lk)
	}
	if mask&hasOpens != 0 {
		if r.Opens = d.U32(); r.Opens > MaxOpens {
			d.Fail(fmt.Errorf("%w: %d open handles", ErrTooLarge, r.Opens))
		}
	}
	if mask&hasOwner != 0 {
		if r.Owner = ids.ServerID(d.U8()); r.Owner == 0 {
			d.Fail(errors.New("wire: redirect to server 0"))
		}
	}
	if mask&hasFlags != 0 {
		if r.Flags = d.U32(); r.Flags == 0 {
			d.Fail(errors.New("wire: empty reply flags"))
		}
	}
	if mask >= hasFlags<<1 {
		d.Fail(fmt.Errorf("wire: unknown reply sections %#x", mask))
	}
	if err := d.End(); err != nil {
		return nil, err
	}
	return r, nil
}

// CallbackKind is a server-initiated message's kind.
type CallbackKind uint8

const (
	// CallbackRevoke asks the client to give a data lock down to Mode
	// (flush dirty data, drop caches), then acknowledge.
	CallbackRevoke CallbackKind = iota + 1
	// CallbackProbe asks whether the client is alive (used before stealing
	// a POSIX lock that blocks another client).
	CallbackProbe
)

// Callback is a server-to-client message. The client's reply is an encoded
// Reply (its Code says whether it complied).
type Callback struct {
	Kind CallbackKind
	Ino  ids.Ino
	Mode LockMode
	Seq  uint64
}

// Append encodes c after b.
func (c *Callback) Append(b []byte) []byte {
	e := newEnc(b)
	e.U8(Version)
	e.U8(uint8(c.Kind))
	e.U64(uint64(c.Ino))
	e.U8(uint8(c.Mode))
	e.U64(c.Seq)
	return e.B
}

// ParseCallback decodes a callback.
func ParseCallback(b []byte) (*Callback, error) {
	d := newDec(b)
	d.version()
	c := &Callback{Kind: CallbackKind(d.U8()), Ino: ids.Ino(d.U64()), Mode: LockMode(d.U8()), Seq: d.U64()}
	if err := d.End(); err != nil {
		return nil, err
	}
	if c.Kind < CallbackRevoke || c.Kind > CallbackProbe || c.Mode > LockExclusive {
		return nil, fmt.Errorf("wire: bad callback kind %d mode %d", c.Kind, c.Mode)
	}
	return c, nil
}

// PeekIno returns the inode a request is about from the first bytes of its
// body, before the rest has arrived (false if too few bytes or another
// version).
func PeekIno(partial []byte) (ids.Ino, bool) {
	h, err := ParseRequestHead(partial)
	return h.Ino, err == nil
}
