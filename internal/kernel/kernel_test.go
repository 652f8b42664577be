package kernel

import (
	"errors"
	"testing"
)

func TestParseRelease(t *testing.T) {
	for release, want := range map[string]Version{
		"6.18.44-fc-v595":                    {6, 18},
		"5.4.0-150-generic":                  {5, 4},
		"5.4":                                {5, 4},
		"6.6":                                {6, 6},
		"5.10.0-28-amd64":                    {5, 10},
		"6.1.0-rpi7-rpi-v8":                  {6, 1},
		"4.18.0-553.el8_10.x86_64":           {4, 18},
		"3.10.0-1160.el7.x86_64":             {3, 10},
		"5.15.153.1-microsoft-standard-WSL2": {5, 15},
		"6.8.0-rc3+":                         {6, 8},
		"6.12.0-0.rc2.24.fc42.x86_64":        {6, 12},
		"5.10.104-tegra":                     {5, 10},
		"5.4.0+":                             {5, 4},
		"5.4-rc1":                            {5, 4},
		"10.0.0":                             {10, 0},
		" 5.4.0\n":                           {5, 4},
	} {
		got, err := ParseRelease(release)
		if err != nil || got != want {
			t.Errorf("ParseRelease(%q) = %v, %v; want %v", release, got, err, want)
		}
	}
	for _, bad := range []string{"", "linux", "5", "5.", ".4", "5.x", "v5.4", "5.-4", "-5.4", "+5.4", "5.+4", "99999999999999999999.1"} {
		if v, err := ParseRelease(bad); !errors.Is(err, ErrUnknown) {
			t.Errorf("ParseRelease(%q) = %v, %v; want %v", bad, v, err, ErrUnknown)
		}
	}
}

func TestCheck(t *testing.T) {
	for release, ok := range map[string]bool{
		"5.4.0-150-generic":        true,
		"5.10.0-28-amd64":          true,
		"6.1.0-rpi7-rpi-v8":        true,
		"10.0.0":                   true,
		"5.3.18-lp152.19-default":  false,
		"4.19.0-27-amd64":          false,
		"4.18.0-553.el8_10.x86_64": false,
		"3.10.0-1160.el7.x86_64":   false,
	} {
		err := Check(release)
		if (err == nil) != ok || errors.Is(err, ErrUnknown) {
			t.Errorf("Check(%q) = %v, want ok=%v", release, err, ok)
		}
	}
	if err := Check("linux"); !errors.Is(err, ErrUnknown) {
		t.Errorf("Check(%q) = %v, want %v", "linux", err, ErrUnknown)
	}
}
