package metaserver

import "github.com/leasefs/leasefs/wire"

// xattrOps are the requests on extended attributes.
var xattrOps = map[wire.Op]opHandler{
	wire.OpGetXattr:    (*Server).opGetXattr,
	wire.OpSetXattr:    (*Server).opSetXattr,
	wire.OpListXattr:   (*Server).opListXattr,
	wire.OpRemoveXattr: (*Server).opRemoveXattr,
}

func (s *Server) opGetXattr(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, shared(r.Ino), func() *wire.Reply {
		v, err := q.st.GetXattr(r.Ino, r.Name)
		if err != nil {
			return wire.ErrorReply(err)
		}
		if v == nil {
			v = []byte{}
		}
		return &wire.Reply{Data: v}
	})
}

func (s *Server) opSetXattr(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, exclusive(r.Ino), s.unlessReplayed(q.sess, r, func() *wire.Reply {
		return errReply(q.st.SetXattr(r.Ino, r.Name, r.Data, r.Flags, q.now))
	}))
}

func (s *Server) opListXattr(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, shared(r.Ino), func() *wire.Reply {
		names, err := q.st.ListXattr(r.Ino)
		if err != nil {
			return wire.ErrorReply(err)
		}
		if names == nil {
			names = []string{}
		}
		return &wire.Reply{Names: names}
	})
}

func (s *Server) opRemoveXattr(q *request) *wire.Reply {
	r := q.r
	return s.underLocks(q.ctx, q.sess, exclusive(r.Ino), s.unlessReplayed(q.sess, r, func() *wire.Reply {
		return errReply(q.st.RemoveXattr(r.Ino, r.Name, q.now))
	}))
}
