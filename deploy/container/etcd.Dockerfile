# etcd FROM scratch, from the etcd binary of Debian's etcd-server package (test clusters only).
FROM scratch
COPY rootfs/ /
EXPOSE 2379 2380
ENTRYPOINT ["/usr/local/bin/etcd"]
CMD ["--data-dir", "/var/lib/etcd", "--listen-client-urls", "http://0.0.0.0:2379", "--advertise-client-urls", "http://0.0.0.0:2379"]
