package bpf

import (
	"errors"
	"fmt"
	"os"
)

// RemovePinDir removes pinDir and everything pinned below it: the
// classifier's maps, its programs' TCX links (each detaches once no process
// holds it), the pod guards and their links. It is what an uninstall does
// once the agent has closed its objects. It refuses a directory that is not
// on bpffs, so that a wrong --bpf-pin-dir never removes files; a pin
// directory that does not exist is no error.
func RemovePinDir(pinDir string) error {
	fi, err := os.Lstat(pinDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("pin directory %s is not a directory", pinDir)
	}
	ok, err := isBPFFS(pinDir)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("pin directory %s is not on bpffs; not removing it", pinDir)
	}
	if err := os.RemoveAll(pinDir); err != nil {
		return fmt.Errorf("remove the pins under %s: %w", pinDir, err)
	}
	return nil
}
