package imagetar

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// epoch is the mtime of every layer entry: the same rootfs then always gives
// the same layer digest, so re-imports are no-ops.
var epoch = time.Unix(0, 0).UTC()

// writeLayerTar writes the tree under root as an uncompressed tar stream with
// root-owned entries. filepath.WalkDir visits in lexical order, which keeps
// the output deterministic.
func writeLayerTar(root string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		return addEntry(tw, p, filepath.ToSlash(rel))
	})
	if err != nil {
		return fmt.Errorf("walk %s: %w", root, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("finish layer tar: %w", err)
	}
	return nil
}

func addEntry(tw *tar.Writer, path, name string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(path); err != nil {
			return err
		}
	}
	h, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("tar header for %s: %w", path, err)
	}
	h.Name = name
	if fi.IsDir() {
		h.Name += "/"
	}
	h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "root", "root"
	h.ModTime, h.AccessTime, h.ChangeTime = epoch, time.Time{}, time.Time{}
	h.Format = tar.FormatPAX
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("tar header for %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("copy %s into layer: %w", path, err)
	}
	return nil
}
