package testbed

import (
	"path/filepath"
	"testing"

	"github.com/edgehop/edgehop/internal/controller"
)

// The CLI finds the controller's token through the testbed's state.
func TestControllerRefToken(t *testing.T) {
	if _, err := (ControllerRef{URL: "http://127.0.0.1:1"}).Token(); err == nil {
		t.Error("a ref without a token file gave a token")
	}
	path := filepath.Join(t.TempDir(), controller.TokenFileName)
	ref := ControllerRef{URL: "http://127.0.0.1:1", TokenFile: path}
	if _, err := ref.Token(); err == nil {
		t.Error("a token file the controller has not made yet gave a token")
	}
	want, err := controller.LoadOrCreateToken(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ref.Token(); err != nil || got != want {
		t.Fatalf("token %q %v, want the controller's %q", got, err, want)
	}
	if _, err := ref.Client(); err != nil {
		t.Fatal(err)
	}
}
