package policy

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// maxFileSize bounds a policy file.
const maxFileSize = 4 << 20

// Parse decodes a policy file. name is used in error messages, and relative
// file paths in the policy (TLS material, token files) are taken from its
// directory. Files the policy names are read now: a policy that parses can
// be used. An empty document is the embedded defaults. The error, if any,
// is an Errors listing every problem with its line and column.
func Parse(name string, data []byte) (*Policy, error) {
	doc, err := decode(name, data, false)
	if err != nil {
		return nil, err
	}
	return build(name, []*rawDoc{doc}, nil)
}

// Load reads and parses the policy file at path.
func Load(path string) (*Policy, error) {
	data, err := readPolicyFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

func readPolicyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fileError(path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fileError(path, err)
	}
	if len(data) > maxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("larger than %d bytes", maxFileSize), Err: ErrFile}
	}
	return data, nil
}

// fileError is an *Error for a policy file that cannot be read; it wraps
// ErrFile and the cause (errors.Is(err, fs.ErrNotExist) works).
func fileError(path string, err error) *Error {
	msg := err.Error()
	var pe *fs.PathError
	if errors.As(err, &pe) {
		msg = pe.Op + ": " + pe.Err.Error()
	}
	return &Error{File: path, Msg: msg, Err: fmt.Errorf("%w: %w", ErrFile, err)}
}

// Overlay returns base with a per-pod override laid over it. The override
// is a policy document of the same schema, except that it may not set the
// fields that belong to the node (name, budget, bulkhead, body, tls,
// credential): budgets are node-wide per upstream and a pod must not pick
// its own, and a pod must not make the agent read files or run commands.
//
// Precedence, most general first: embedded defaults, base defaults,
// override defaults, base entry, override entry. An override entry with the
// same host and port as a base entry refines it field by field. An entry
// the base does not have must name an exact host and a port; it refines the
// base entry that matches that destination (so the node's TLS, credential
// and budget still apply to it). An override's defaults change every base
// entry that does not set the field itself; to change a field a base entry
// sets, the override names that entry. name is used in error messages.
func Overlay(base *Policy, name string, override []byte) (*Policy, error) {
	doc, err := decode(name, override, true)
	if err != nil {
		return nil, err
	}
	docs := make([]*rawDoc, 0, len(base.docs)+1)
	docs = append(docs, base.docs...)
	docs = append(docs, doc)
	parents := make([]*Policy, 0, len(base.parents)+1)
	parents = append(parents, base.parents...)
	parents = append(parents, base)
	return build(base.Source+" + "+name, docs, parents)
}

func decode(name string, data []byte, override bool) (*rawDoc, error) {
	if len(data) > maxFileSize {
		return nil, Errors{{File: name, Msg: fmt.Sprintf("larger than %d bytes", maxFileSize), Err: ErrFile}}
	}
	dir, err := filepath.Abs(filepath.Dir(name))
	if err != nil {
		dir = filepath.Dir(name)
	}
	d := &decoder{file: name, dir: dir, override: override}
	doc := d.decodeDoc(data)
	if len(d.errs) > 0 {
		sortErrors(d.errs)
		if len(d.errs) > maxErrors {
			d.errs = d.errs[:maxErrors]
		}
		return nil, d.errs
	}
	return doc, nil
}
