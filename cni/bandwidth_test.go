package cni

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseBandwidth(t *testing.T) {
	const burst = defaultBurst
	tests := []struct {
		name            string
		ingress, egress string
		want            *Bandwidth
		wantErr         string // in the error; "" for none
	}{
		{name: "none"},
		{name: "ingress only", ingress: "1M", want: &Bandwidth{IngressRate: 1e6, IngressBurst: burst}},
		{name: "egress binary suffix", egress: "10Mi", want: &Bandwidth{EgressRate: 10 << 20, EgressBurst: burst}},
		{
			name: "both", ingress: "500k", egress: "1G",
			want: &Bandwidth{IngressRate: 5e5, IngressBurst: burst, EgressRate: 1e9, EgressBurst: burst},
		},
		{name: "plain number", ingress: "2500", want: &Bandwidth{IngressRate: 2500, IngressBurst: burst}},
		{name: "fraction", egress: "1.5k", want: &Bandwidth{EgressRate: 1500, EgressBurst: burst}},
		{name: "lower bound", ingress: "1k", want: &Bandwidth{IngressRate: 1000, IngressBurst: burst}},
		{name: "upper bound", egress: "1P", want: &Bandwidth{EgressRate: 1e15, EgressBurst: burst}},
		{name: "too small", ingress: "999", wantErr: "ingress bandwidth"},
		{name: "milli rounds up to 1", egress: "100m", wantErr: "egress bandwidth"},
		{name: "too large", egress: "1.1P", wantErr: "unreasonably large"},
		{name: "garbage", ingress: "fast", wantErr: `"fast"`},
		{name: "bad egress with good ingress", ingress: "1M", egress: "-1M", wantErr: "egress bandwidth"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBandwidth(tt.ingress, tt.egress)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseBandwidth(%q, %q) = %+v, %v; want an error with %q", tt.ingress, tt.egress, got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseBandwidth(%q, %q) = %+v, want %+v", tt.ingress, tt.egress, got, tt.want)
			}
		})
	}
}
