package migration

import "testing"

func TestValidVolume(t *testing.T) {
	for _, v := range []string{"/data", "/var/lib/redis", "/etc/skel", "/.edgehop-volumesX"} {
		if err := ValidVolume(v); err != nil {
			t.Errorf("ValidVolume(%q): %v", v, err)
		}
	}
	for _, v := range []string{"", "/", "data", "/data/", "/data/../etc", "/proc", "/proc/sys", "/sys/fs", "/dev/shm", "/.edgehop-volumes", "/.edgehop-volumes/0"} {
		if err := ValidVolume(v); err == nil {
			t.Errorf("ValidVolume(%q) accepted", v)
		}
	}
	if VolumeDir(3) != ".edgehop-volumes/3" {
		t.Errorf("VolumeDir(3) = %q", VolumeDir(3))
	}
}
